#!/bin/bash
B=/tmp/gf-final;  # go build -o /tmp/gf-final ./cmd/glmflash at commit 743fb59
 L=configs/limits/amd-epyc-2t.json; O=/tmp/final-cpu
cd /work/main
for r in 1 2; do
  for p in fp32 bf16; do
    uptime > $O/std-$p-$r.log; $B bench --preset bench --prompt 512 --batch 1,8 --reps 3 --precision $p --limits $L >> $O/std-$p-$r.log 2>&1
  done
done
uptime > $O/ctx8192.log; $B bench --preset bench --prompt 32 --decode-context 8192 --batch 1 --decode-steps 16 --reps 3 --limits $L >> $O/ctx8192.log 2>&1
uptime > $O/ctx32.log; $B bench --preset bench --prompt 32 --decode-context 32 --batch 1 --decode-steps 16 --reps 3 --limits $L >> $O/ctx32.log 2>&1
echo done > $O/done
