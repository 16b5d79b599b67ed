#!/bin/bash
out=$1; rounds=$2; mkdir -p $out
cd /work/wt-ctxrss
L=configs/limits/amd-epyc-2t.json
idle() { read -r _ a b c d e f g _ < /proc/stat; t1=$((a+b+c+d+e+f+g)); i1=$d; sleep 1; read -r _ a b c d e f g _ < /proc/stat; t2=$((a+b+c+d+e+f+g)); i2=$d; echo $(( 100*(i2-i1)/(t2-t1) )); }
waitq() { for k in $(seq 90); do [ $(idle) -ge 90 ] && return; done; echo "(not idle)"; }
for i in $(seq $rounds); do
  for b in old new; do
    f=$out/$b-dec32-$i.log; q=$(waitq)
    echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/') $q" > $f
    /usr/bin/time -v /tmp/ctxrss/glmf-$b bench --preset bench --prompt 32 --decode-context 32 --batch 1 --decode-steps 128 --reps 5 --limits $L >> $f 2>&1
  done
done
echo done > $out/DONE
