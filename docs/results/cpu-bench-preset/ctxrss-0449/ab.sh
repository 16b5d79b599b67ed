#!/bin/bash
# interleaved A/B: old = df678d5 (main at the branch point), new = ctxrss HEAD
out=$1; mkdir -p $out
cd /work/wt-ctxrss
L=configs/limits/amd-epyc-2t.json
run() { # name bin args...
  f=$out/$1.log; b=$2; shift 2
  echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" > $f
  /usr/bin/time -v /tmp/ctxrss/glmf-$b bench --preset bench "$@" --limits $L >> $f 2>&1
  echo "== end $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" >> $f
}
for i in 1 2 3; do
  for b in old new; do
    run $b-ctx8192-$i $b --prompt 32 --decode-context 8192 --batch 1 --decode-steps 16 --reps 3
    run $b-std-$i $b --prompt 512 --batch 1,8 --reps 3
    run $b-ctx32-$i $b --prompt 32 --decode-context 32 --batch 1 --decode-steps 16 --reps 3
  done
done
echo done > $out/DONE
