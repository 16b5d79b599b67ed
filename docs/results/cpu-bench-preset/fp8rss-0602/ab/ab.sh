#!/bin/bash
# interleaved A/B: old=/tmp/gf-final (743fb59) new=/tmp/gf-rss
cd /work/wt-fp8rss
prec=$1; n=$2
for i in $(seq 1 $n); do
  if [ $((i%2)) = 1 ]; then order="gf-final gf-rss"; else order="gf-rss gf-final"; fi
  for b in $order; do
    /usr/bin/time -f "cpu %P" /tmp/$b bench --model /tmp/fp8bench --prompt 512 --batch 1,8 --reps 3 --precision $prec --limits configs/limits/amd-epyc-2t.json > /tmp/fp8rss-ab/$b-$prec-$i.log 2>&1
  done
done
