#!/bin/bash
# interleaved A/B, each run started when the machine has been idle for a second (up to 90 s of waiting)
out=$1; rounds=$2; shift 2; kinds="$@"
mkdir -p $out
cd /work/wt-ctxrss
L=configs/limits/amd-epyc-2t.json
idle() { # percent idle over 1 s
  read -r _ a b c d e f g _ < /proc/stat; t1=$((a+b+c+d+e+f+g)); i1=$d
  sleep 1
  read -r _ a b c d e f g _ < /proc/stat; t2=$((a+b+c+d+e+f+g)); i2=$d
  echo $(( 100*(i2-i1)/(t2-t1) ))
}
waitq() { for k in $(seq 90); do [ $(idle) -ge 90 ] && return; done; echo "(not idle)"; }
run() { # name bin args...
  f=$out/$1.log; b=$2; shift 2
  q=$(waitq)
  echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/') $q" > $f
  /usr/bin/time -v /tmp/ctxrss/glmf-$b bench --preset bench "$@" --limits $L >> $f 2>&1
  echo "== end $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" >> $f
}
for i in $(seq $rounds); do
  for b in old new; do
    for k in $kinds; do
      case $k in
        ctx8192) run $b-ctx8192-$i $b --prompt 32 --decode-context 8192 --batch 1 --decode-steps 16 --reps 3;;
        std) run $b-std-$i $b --prompt 512 --batch 1,8 --reps 3;;
        ctx32) run $b-ctx32-$i $b --prompt 32 --decode-context 32 --batch 1 --decode-steps 16 --reps 3;;
      esac
    done
  done
done
echo done > $out/DONE
