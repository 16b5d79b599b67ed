#!/bin/bash
# interleaved A/B with contamination accounting: for each bench run, the CPU seconds
# used by other processes during it (/proc/stat busy time minus the run's own user+sys)
# usage: ab.sh OUTDIR ROUNDS PREC...
out=$1; rounds=$2; shift 2
precs=("$@")
mkdir -p $out
cd /work/wt-fp8dense
L=configs/limits/amd-epyc-2t.json
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8, $9}' /proc/stat; }
waitidle() {
  for w in $(seq 1 90); do
    l=$(ps -eo pcpu --sort=-pcpu | sed -n 2p); [ "${l%.*}" -lt 20 ] && return; sleep 2
  done
}
for i in $(seq 1 $rounds); do
  for prec in "${precs[@]}"; do
    for b in old new; do
      f=$out/$b-$prec-$i.log
      waitidle
      read b0 s0 < <(busy)
      echo "== $(date -u +%H:%M:%S) $(uptime | sed 's/.*load/load/')" > $f
      /usr/bin/time -f "own_cpu_s %U %S" /tmp/fp8ab/glmf-$b bench --model /tmp/fp8bench --prompt 512 --batch 1,8 --reps 3 --precision $prec --limits $L >> $f 2>&1
      read b1 s1 < <(busy)
      own=$(awk '/^own_cpu_s/{print $2+$3}' $f)
      echo "== end $(date -u +%H:%M:%S) other_cpu_s=$(awk -v a=$b0 -v b=$b1 -v o=$own 'BEGIN{printf "%.1f", (b-a)/100-o}') steal_s=$(awk -v a=$s0 -v b=$s1 'BEGIN{printf "%.1f",(b-a)/100}')" >> $f
    done
  done
done
