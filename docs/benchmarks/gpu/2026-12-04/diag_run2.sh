#!/usr/bin/env bash
cd "$(dirname "$0")"
python3 -c 'import lzma,shutil;shutil.copyfileobj(lzma.open("rlft.xz"),open("/tmp/rlft","wb"))'; chmod +x /tmp/rlft
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia,glob,os;print(":".join(sorted(glob.glob(os.path.join(nvidia.__path__[0],"*","lib")))))'):$LD_LIBRARY_PATH
export RUST_BACKTRACE=1 HF_HUB_OFFLINE=1
SETS="--grpo-set num_generations=2 --grpo-set generation_batch_size=16 --grpo-set per_device_train_batch_size=1 --grpo-set gradient_accumulation_steps=8 --grpo-set max_completion_length=32 --grpo-set adam_beta2=0.95 --grpo-set weight_decay=0.01 --grpo-set max_grad_norm=1.0 --grpo-set bf16=true"
python3 -c 'import sys; sys.path.insert(0, "gpu_check"); import models; models.write("qwen25_3b", "/tmp/m3b", "bfloat16", "cuda")' 2>/dev/null
echo "=== non-blocking"; timeout 40 /tmp/rlft bench --run-case grpo --model /tmp/m3b --device cuda --reps 3 $SETS 2>&1 | grep -v '^ *[0-9]*: <unknown>' | grep -v "^ *at " | head -40
nvidia-smi --query-gpu=memory.used --format=csv
echo "=== blocking"; CUDA_LAUNCH_BLOCKING=1 timeout 70 /tmp/rlft bench --run-case grpo --model /tmp/m3b --device cuda --reps 3 $SETS 2>&1 | grep -v '^ *[0-9]*: <unknown>' | grep -v "^ *at " | head -40
echo "=== non-blocking f32"; timeout 40 /tmp/rlft bench --run-case grpo --model /tmp/m3b --device cuda --reps 3 ${SETS/bf16=true/bf16=false} 2>&1 | grep -v '^ *[0-9]*: <unknown>' | grep -v "^ *at " | head -40
