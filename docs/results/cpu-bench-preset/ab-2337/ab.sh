#!/bin/bash
# interleaved A/B on an idle machine: old = 7d917a2 (main before the cpupre merge), new = 13936b0
out=$1; mkdir -p $out
cd /work/main
L=configs/limits/amd-epyc-2t.json
for i in 1 2; do
  for prec in fp32 bf16; do
    for b in old new; do
      f=$out/$b-$prec-$i.log
      echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" > $f
      /usr/bin/time -v /tmp/ab/glmf-$b bench --preset bench --prompt 512 --batch 1,8 --reps 3 --precision $prec --limits $L >> $f 2>&1
      echo "== end $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" >> $f
    done
  done
done
for b in old new; do
  f=$out/$b-fp8.log
  echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" > $f
  /usr/bin/time -v /tmp/ab/glmf-$b bench --preset bench --fp8 --prompt 512 --batch 1,8 --reps 3 --limits $L >> $f 2>&1
  echo "== end $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" >> $f
done
