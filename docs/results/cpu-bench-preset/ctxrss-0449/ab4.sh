#!/bin/bash
out=$1; cycles=$2; mkdir -p $out
cd /work/wt-ctxrss
L=configs/limits/amd-epyc-2t.json
idle() { read -r _ a b c d e f g _ < /proc/stat; t1=$((a+b+c+d+e+f+g)); i1=$d; sleep 1; read -r _ a b c d e f g _ < /proc/stat; t2=$((a+b+c+d+e+f+g)); i2=$d; echo $(( 100*(i2-i1)/(t2-t1) )); }
waitq() { for k in $(seq 90); do [ $(idle) -ge 90 ] && return; done; echo "(not idle)"; }
n=0
for i in $(seq $cycles); do
  for b in old new new old; do
    n=$((n+1)); f=$out/$b-dec32-$n.log; q=$(waitq)
    echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/') $q" > $f
    /usr/bin/time -v /tmp/ctxrss/glmf-$b bench --preset bench --prompt 32 --decode-context 32 --batch 1 --decode-steps 128 --reps 5 --limits $L >> $f 2>&1
  done
done
echo done > $out/DONE
