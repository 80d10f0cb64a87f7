//! Activation (gradient) checkpointing: keep each decoder layer's input, not its internals, and
//! recompute a layer's forward when the backward reaches it.
//!
//! A training forward normally keeps every layer's intermediate tensors until the backward
//! (for SmolLM2-135M, ~4 KB per token per layer). With checkpointing, each layer runs with a
//! graph that is dropped at once (its output detached), and only the `[tokens, hidden]` layer
//! inputs stay; [`Checkpointing::backward`] then walks the layers from last to first,
//! recomputing each with a graph on its saved input and back-propagating the incoming gradient
//! through it (`sum(layer(x) * dy)` has gradient `dy`-weighted). Peak activation memory drops
//! from all layers' internals to one layer's plus the inputs, for about one more forward pass
//! of compute — what transformers' `gradient_checkpointing` trades.
//!
//! Usage: start a [`Checkpointing`] session for a model before the training forward(s) of a
//! micro-batch (that model's differentiable forwards on this thread record into it) and call
//! [`Checkpointing::backward`] instead of [`crate::trainable::backward`].
//!
//! A session belongs to one model on one thread. Two trainings in one process share rayon's
//! workers, and a worker that waits inside one step's parallel loop may run a whole job of the
//! other training meanwhile, on the same thread: that forward must not record into this
//! session (it would lose its layers' gradients). So the thread's sessions are keyed by the
//! model they were begun for, and a forward records only into its own model's session.
//! LoRA dropout masks are replayed exactly: each adapter's draw counter is rewound before its
//! layer is recomputed. Gradients equal those without checkpointing up to float rounding
//! (tests).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};

use crate::error::{ModelError, Result};

/// One layer's forward: `(layer index, input) -> output`, with a graph.
pub(crate) type LayerFn = Rc<dyn Fn(usize, &Tensor) -> Result<Tensor>>;

/// One recorded stack of layers.
struct Segment {
    /// The first layer's input as computed (tracked when the embedding is trainable).
    x0: Tensor,
    /// Each layer's input, detached.
    inputs: Vec<Tensor>,
    /// Per layer, the LoRA dropout draw counters of its adapters and their values before the
    /// layer ran.
    draws: Vec<Vec<(Arc<AtomicU64>, u64)>>,
    step: LayerFn,
    /// The last layer's output, a leaf the rest of the forward builds on.
    leaf: Var,
}

thread_local! {
    /// This thread's sessions: the model's key ([`key`]) and what its forwards recorded.
    static TAPE: RefCell<Vec<(usize, Vec<Segment>)>> = const { RefCell::new(Vec::new()) };
}

/// A model whose layer stacks a session records: [`crate::decoder::CausalLm`]. (A trait, so
/// that this module needs nothing of the decoder but a model's identity.)
pub trait Checkpointed {}

/// A model's identity for the sessions: its address (a session borrows the model, so it does
/// not move while the session lives).
fn key<M: Checkpointed>(model: &M) -> usize {
    model as *const M as usize
}

/// Whether a session for `model` is recording on this thread.
pub(crate) fn active<M: Checkpointed>(model: &M) -> bool {
    let k = key(model);
    TAPE.with(|t| t.borrow().iter().any(|(m, _)| *m == k))
}

/// Runs `n` layers from `x0` without keeping their internals and records them in the session;
/// returns the last output as a fresh leaf (the rest of the forward builds its graph on it).
/// `counters[l]` are layer `l`'s LoRA dropout draw counters.
pub(crate) fn run_layers<M: Checkpointed>(
    model: &M,
    x0: Tensor,
    n: usize,
    counters: Vec<Vec<Arc<AtomicU64>>>,
    step: LayerFn,
) -> Result<Tensor> {
    let mut inputs = Vec::with_capacity(n);
    let mut draws = Vec::with_capacity(n);
    let mut x = x0.detach();
    for (li, layer_counters) in counters.into_iter().enumerate().take(n) {
        draws.push(
            layer_counters
                .into_iter()
                .map(|c| {
                    let v = c.load(Ordering::SeqCst);
                    (c, v)
                })
                .collect(),
        );
        // The output's graph (this layer's internals) is dropped with `y`.
        let y = step(li, &x)?;
        inputs.push(x);
        x = y.detach();
    }
    let leaf = Var::from_tensor(&x)?;
    let out = leaf.as_tensor().clone();
    let k = key(model);
    TAPE.with(|t| {
        t.borrow_mut()
            .iter_mut()
            .find(|(m, _)| *m == k)
            .map(|(_, segs)| {
                segs.push(Segment {
                    x0,
                    inputs,
                    draws,
                    step,
                    leaf,
                })
            })
            .ok_or_else(|| {
                ModelError::Invalid("no checkpointing session is active for this model".into())
            })
    })?;
    Ok(out)
}

/// An activation-checkpointing session for one model on this thread (see the module docs).
/// Dropping it without [`Self::backward`] discards what was recorded.
#[must_use = "call backward() to get the gradients"]
pub struct Checkpointing<'m> {
    key: usize,
    _model: std::marker::PhantomData<&'m ()>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl<'m> Checkpointing<'m> {
    /// Starts recording `model`'s differentiable forwards on this thread. Errors if a session
    /// for this model is already active here.
    pub fn begin<M: Checkpointed>(model: &'m M) -> Result<Checkpointing<'m>> {
        let k = key(model);
        TAPE.with(|t| {
            let mut t = t.borrow_mut();
            if t.iter().any(|(m, _)| *m == k) {
                return Err(ModelError::Invalid(
                    "a checkpointing session is already active for this model on this thread"
                        .into(),
                ));
            }
            t.push((k, Vec::new()));
            Ok(Checkpointing {
                key: k,
                _model: std::marker::PhantomData,
                _not_send: std::marker::PhantomData,
            })
        })
    }

    /// This session's recorded forwards, taken out of the thread's list.
    fn take(&self) -> Option<Vec<Segment>> {
        TAPE.with(|t| {
            let mut t = t.borrow_mut();
            let i = t.iter().position(|(m, _)| *m == self.key)?;
            Some(t.remove(i).1)
        })
    }

    /// Gradients of `loss` for `vars` (as [`crate::trainable::backward`]), recomputing the
    /// recorded layers last to first.
    pub fn backward(self, loss: &Tensor, vars: &[(String, Var)]) -> Result<GradStore> {
        let segments = self.take().unwrap_or_default();
        if segments.is_empty() {
            return Err(ModelError::Invalid(
                "no forward of this checkpointing session's model was recorded: run the \
                 training forward on the model passed to Checkpointing::begin, on this thread"
                    .into(),
            ));
        }
        let mut out = GradStore::default();
        let mut all = loss.backward()?;
        take_vars(&mut all, vars, &mut out)?;
        for seg in segments.into_iter().rev() {
            let Some(mut g) = all.remove(seg.leaf.as_tensor()) else {
                continue; // the loss does not depend on this forward
            };
            for li in (0..seg.inputs.len()).rev() {
                for (c, v) in &seg.draws[li] {
                    c.store(*v, Ordering::SeqCst);
                }
                let x = Var::from_tensor(&seg.inputs[li])?;
                let y = (seg.step)(li, x.as_tensor())?;
                let mut gs = (y * &g)?.sum_all()?.backward()?;
                take_vars(&mut gs, vars, &mut out)?;
                g = gs
                    .remove(x.as_tensor())
                    .ok_or_else(|| {
                        ModelError::Invalid(format!(
                            "layer {li}'s output does not depend on its input"
                        ))
                    })?
                    .detach();
            }
            if seg.x0.track_op() {
                // A trainable embedding: the first layer's input gradient flows into it.
                let mut gs = (&seg.x0 * &g)?.sum_all()?.backward()?;
                take_vars(&mut gs, vars, &mut out)?;
            }
        }
        Ok(out)
    }
}

impl Drop for Checkpointing<'_> {
    fn drop(&mut self) {
        self.take();
    }
}

/// Moves the gradients of `vars` from `from` into `into`, adding to what is there; detached, as
/// [`crate::trainable::backward`] returns them.
fn take_vars(from: &mut GradStore, vars: &[(String, Var)], into: &mut GradStore) -> Result<()> {
    for (_, var) in vars {
        let t = var.as_tensor();
        if let Some(g) = from.remove(t) {
            let sum = match into.remove(t) {
                Some(prev) => (prev + g)?,
                None => g,
            };
            into.insert(t, sum.detach());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Family;
    use crate::decoder::CausalLm;
    use crate::lora::{attach_lora, set_dropout_seed, LoraConfig};
    use crate::shared_prefix::{shared_prefix_batch, shared_prefix_logprobs};
    use crate::tiny::{random_model, tiny_config};
    use crate::trainable::{backward, make_trainable, masked_mean_nll, next_token_batch};
    use crate::trainable::{sequence_logprobs, NextTokenBatch};
    use candle_core::{DType, Device};

    fn batch() -> NextTokenBatch {
        let rows = vec![
            vec![1, 5, 9, 300, 42, 17, 250, 77, 2],
            vec![1, 88, 7, 300, 9, 2],
        ];
        next_token_batch(&rows, &[1, 3], 2, &Device::Cpu).unwrap()
    }

    fn max_rel_diff(a: &GradStore, b: &GradStore, vars: &[(String, Var)]) -> f32 {
        let mut worst = 0f32;
        for (name, v) in vars {
            let (x, y) = (a.get(v.as_tensor()), b.get(v.as_tensor()));
            let (x, y) = match (x, y) {
                (Some(x), Some(y)) => (x, y),
                (None, None) => continue,
                _ => panic!("{name}: gradient in one store only"),
            };
            let d = (x - y).unwrap().abs().unwrap().max_all().unwrap();
            let s = y.abs().unwrap().max_all().unwrap();
            let (d, s) = (d.to_scalar::<f32>().unwrap(), s.to_scalar::<f32>().unwrap());
            worst = worst.max(d / s.max(1e-6));
        }
        worst
    }

    /// Gradients of the same loss with and without checkpointing (a session for `model`).
    fn both(
        model: &std::cell::RefCell<CausalLm>,
        vars: &[(String, Var)],
        loss: impl Fn() -> Tensor,
        reseed: impl Fn(),
    ) -> (GradStore, GradStore) {
        reseed();
        let plain = backward(&loss(), vars).unwrap();
        reseed();
        let m = model.borrow();
        let session = Checkpointing::begin(&*m).unwrap();
        let l = loss();
        let ckpt = session.backward(&l, vars).unwrap();
        assert!(!active(&*m), "the session ends with backward");
        (plain, ckpt)
    }

    #[test]
    fn checkpointed_gradients_equal_plain_ones() {
        for family in [Family::Llama, Family::Qwen2, Family::Qwen3] {
            // Full fine-tuning (the embedding and tied head get gradients through both routes).
            let mut m = random_model(tiny_config(family), 4, DType::F32, &Device::Cpu).unwrap();
            let vars = make_trainable(&mut m, |_| true).unwrap();
            let m = std::cell::RefCell::new(m);
            let nt = batch();
            let loss = || {
                let lp = sequence_logprobs(&m.borrow(), &nt.batch, &nt.targets, true).unwrap();
                masked_mean_nll(&lp, &nt.mask).unwrap()
            };
            let (a, b) = both(&m, &vars, loss, || ());
            assert_eq!(a.get_ids().count(), b.get_ids().count());
            let d = max_rel_diff(&a, &b, &vars);
            assert!(d < 1e-4, "{family:?} full: {d}");

            // LoRA with dropout: the recomputation replays the forward's masks.
            let mut m = random_model(tiny_config(family), 4, DType::F32, &Device::Cpu).unwrap();
            let cfg = LoraConfig {
                r: 4,
                lora_alpha: 8.0,
                lora_dropout: 0.3,
                target_modules: vec!["all-linear".into()],
                init_lora_weights: false,
                seed: 2,
                ..LoraConfig::default()
            };
            let vars = attach_lora(&mut m, &cfg).unwrap();
            let m = std::cell::RefCell::new(m);
            let reseed = || set_dropout_seed(&mut m.borrow_mut(), Some(9));
            let p0: Vec<u32> = vec![5, 6, 7, 8, 9];
            let p1: Vec<u32> = vec![10, 11];
            let c: Vec<Vec<u32>> = vec![vec![12, 13, 14], vec![15], vec![16, 17], vec![18, 19]];
            let comps: Vec<&[u32]> = c.iter().map(|x| &x[..]).collect();
            let sb =
                shared_prefix_batch(&[&p0, &p1], &comps, &[0, 0, 1, 1], 0, &Device::Cpu).unwrap();
            let loss = || {
                let mm = m.borrow();
                let (lp, _) = shared_prefix_logprobs(&mm, &sb, true, false, 1.0).unwrap();
                masked_mean_nll(&lp, &sb.mask).unwrap()
            };
            let (a, b) = both(&m, &vars, loss, reseed);
            let d = max_rel_diff(&a, &b, &vars);
            assert!(d < 1e-4, "{family:?} lora + dropout, shared prompts: {d}");
            // Without the replay the masks would differ: a fresh draw gives other gradients.
            reseed();
            let first = backward(&loss(), &vars).unwrap();
            let second = backward(&loss(), &vars).unwrap();
            assert!(max_rel_diff(&first, &second, &vars) > 1e-3, "{family:?}");
        }
    }

    #[test]
    fn sessions_are_per_model_and_end_on_drop() {
        let a = random_model(tiny_config(Family::Llama), 1, DType::F32, &Device::Cpu).unwrap();
        let b = random_model(tiny_config(Family::Llama), 2, DType::F32, &Device::Cpu).unwrap();
        let s = Checkpointing::begin(&a).unwrap();
        assert!(active(&a) && !active(&b));
        assert!(Checkpointing::begin(&a).is_err());
        let t = Checkpointing::begin(&b).unwrap();
        assert!(active(&b));
        drop(s);
        assert!(!active(&a) && active(&b));
        drop(t);
        assert!(!active(&b));
        // Inference forwards record nothing (and need no session); a backward with nothing
        // recorded says what went wrong.
        let nt = batch();
        let s = Checkpointing::begin(&a).unwrap();
        a.forward(&nt.batch, None, false).unwrap();
        assert!(TAPE.with(|t| t.borrow().iter().all(|(_, segs)| segs.is_empty())));
        let err = s
            .backward(&Tensor::new(1f32, &Device::Cpu).unwrap(), &[])
            .unwrap_err();
        assert!(err.to_string().contains("Checkpointing::begin"), "{err}");
    }

    /// Another training's forward that runs on this thread inside a session (a rayon worker
    /// waiting in one step's parallel loop may run the other's job) keeps its whole graph:
    /// its gradients equal those computed with no session at all.
    #[test]
    fn another_models_forward_inside_a_session_keeps_its_graph() {
        let mut other =
            random_model(tiny_config(Family::Llama), 5, DType::F32, &Device::Cpu).unwrap();
        let vars = make_trainable(&mut other, |_| true).unwrap();
        let nt = batch();
        let loss = || {
            let lp = sequence_logprobs(&other, &nt.batch, &nt.targets, true).unwrap();
            masked_mean_nll(&lp, &nt.mask).unwrap()
        };
        let alone = backward(&loss(), &vars).unwrap();
        let mut m = random_model(tiny_config(Family::Llama), 6, DType::F32, &Device::Cpu).unwrap();
        let own_vars = make_trainable(&mut m, |_| true).unwrap();
        let session = Checkpointing::begin(&m).unwrap();
        let own = {
            let lp = sequence_logprobs(&m, &nt.batch, &nt.targets, true).unwrap();
            masked_mean_nll(&lp, &nt.mask).unwrap()
        };
        let inside = backward(&loss(), &vars).unwrap();
        assert_eq!(alone.get_ids().count(), inside.get_ids().count());
        assert!(max_rel_diff(&alone, &inside, &vars) < 1e-6);
        // The session's own forward was recorded and its backward still works.
        let g = session.backward(&own, &own_vars).unwrap();
        assert!(own_vars.iter().all(|(_, v)| g.get(v.as_tensor()).is_some()));
    }
}
