#!/bin/bash
out=$1; mkdir -p $out
cd /work/wt-ctxrss
L=configs/limits/amd-epyc-2t.json
for b in old new; do
  f=$out/$b-ctx8192-bf16.log
  echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" > $f
  /usr/bin/time -v /tmp/ctxrss/glmf-$b bench --preset bench --prompt 32 --decode-context 8192 --batch 1 --decode-steps 16 --reps 3 --precision bf16 --limits $L >> $f 2>&1
done
echo done > $out/DONE
