#!/bin/bash
# interleaved A/B: old = main 2082789, new = cpupre; logs into $1
out=$1; mkdir -p $out
cd /work/wt-cpupre
L=configs/limits/amd-epyc-2t.json
for i in 1 2; do
  for prec in fp32 bf16; do
    for b in old new; do
      f=$out/$b-$prec-$i.log
      echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" > $f
      /usr/bin/time -v /tmp/cpupre/glmf-$b bench --preset bench --prompt 512 --batch 1,8 --reps 3 --precision $prec --limits $L >> $f 2>&1
      echo "== end $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" >> $f
    done
  done
done
# FP8 layout (checkpoint written once into /tmp/cpupre/cache), fp32
for b in old new; do
  f=$out/$b-fp8.log
  echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" > $f
  /usr/bin/time -v /tmp/cpupre/glmf-$b bench --preset bench --fp8 --cache-dir /tmp/cpupre/cache --prompt 512 --batch 1,8 --reps 3 --limits $L >> $f 2>&1
  echo "== end $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" >> $f
done
