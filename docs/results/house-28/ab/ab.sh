set -u
xz -d -c bin/glmflash.xz > bin/glmflash && xz -d -c bin/glmflash-old.xz > bin/glmflash-old && chmod +x bin/glmflash bin/glmflash-old
CK=/dev/shm/glmflash-gpu
[ -f $CK/model.safetensors.index.json ] || bin/glmflash init-random --preset gpu --fp8 --shard-mib 4096 --out $CK --force > $OUT/init.log 2>&1
for i in 1 2 3; do for b in glmflash-old glmflash; do
  timeout 150 bin/$b bench --device cuda --model $CK --config configs/presets/cuda.yaml --precision bf16 --prompt 4096 --batch 1,8,64 --reps 3 --decode-steps 16 --gemm-report=false --json $OUT/$b-$i.json > $OUT/$b-$i.log 2>&1; echo "$b run $i rc=$?"
  grep -E '^(prefill|decode batch)' $OUT/$b-$i.log | sed "s/^/$b $i: /" | cut -c1-150
done; done
