#!/usr/bin/env bash
# Issue 32's GPU checks, in one run on one H200 (about 6 minutes):
#   1. the filer's 6.1 GB run (bench/specs/filer_6gb.yaml) trained by the worker itself: each
#      save's blocking time, its overlapped steps' excess and its write, as the worker reports
#      them (target: blocking + excess <= 10% of the write);
#   2. bench/gpu_mfu.py in BF16 and FP8 with every host sync in the timed steps counted and
#      located (target: none);
#   3. bench/checkpoint.py on the same state, the worker's save before this issue against now
#      (what the changes were worth), written to memory so the disk does not set the pace.
# Run from the repository root on the GPU machine; what a missing package needs comes as
# wheels in .whl (the image lacks pydantic and torchao). Logs and JSON go to $OUT.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
echo "== machine"
python3 -c "import torch, sys; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'python', sys.version.split()[0])"
python3 -c "import torchao; print('torchao', torchao.__version__)" 2>&1 | tail -1
nproc; free -g | head -2; df -h /tmp /dev/shm | tail -2

echo "== the writer process under this torch (an option; the worker writes from a thread)"
timeout 60 python3 - <<'EOF' > "$OUT/smoke.log" 2>&1
import tempfile, torch
from pathlib import Path
from worker import checkpoint
from worker.distributed import init_distributed, read_launch_env, shutdown_distributed
init_distributed(read_launch_env({}), torch.device("cuda", 0))
model = torch.nn.Linear(256, 256, device="cuda")
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(4, 256, device="cuda")).sum().backward(); opt.step()
state = checkpoint.training_state([model], [opt], checkpoint.TrainerState(), 0)
saver = checkpoint.AsyncCheckpointer(Path(tempfile.mkdtemp()), state, checkpoint.SaveOptions(writer_process=True))
saver.save(1); saver.wait_for_staging(); saved = saver.wait(); saver.close()
assert saved is not None and saved.corrupt is None, saved
print("SMOKE OK", saver.options)
shutdown_distributed()
EOF
grep -q "SMOKE OK" "$OUT/smoke.log" && echo "writer process: ok" || tail -5 "$OUT/smoke.log"

echo "== 1. the filer's 6.1 GB run, the worker's own reports"
rm -rf /tmp/ckpt
timeout 200 python3 -m torch.distributed.run --nproc-per-node 1 -m worker.train \
    --spec bench/specs/filer_6gb.yaml --checkpoint-dir /tmp/ckpt \
    --metrics-file "$OUT/metrics.jsonl" > "$OUT/train.log" 2>&1
echo "exit $?"
grep -E "^checkpoint step|Error|error" "$OUT/train.log" | grep -v DEBUG | head -12
grep -E "^step " "$OUT/train.log" | awk 'NR % 6 == 1' | cut -c1-120 | head -14
rm -rf /tmp/ckpt

echo "== 2. gpu_mfu: host syncs in the timed steps"
timeout 170 python3 bench/gpu_mfu.py --layers 4 --steps 8 --warmup 3 > "$OUT/mfu.log" 2>&1
echo "exit $?"
grep -v "DEBUG\|INFO" "$OUT/mfu.log" | tail -12 | cut -c1-600

echo "== 3. bench/checkpoint.py: the save before this issue (main), now, and with a writer process"
timeout 150 python3 bench/checkpoint.py --device cuda --shape filer --variants main,current,process \
    --reps 1 --steps-alone 6 --dir /dev/shm > "$OUT/ckpt_bench.log" 2>&1
echo "exit $?"
grep -v "DEBUG\|INFO" "$OUT/ckpt_bench.log" | tail -9 | cut -c1-1500
