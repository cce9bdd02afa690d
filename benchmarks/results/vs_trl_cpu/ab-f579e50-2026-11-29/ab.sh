set -e
for i in 1 2 3; do
  for tree in old new; do
    if [ $tree = old ]; then root=/tmp/wt-old; else root=/work/main; fi
    pp=$root/core:$root/plugins/fsdp:$root/plugins/vllm:$root/plugins/megatron
    cd $root && PYTHONPATH=$pp timeout 600 /work/main/.venv/bin/python benchmarks/vs_trl_cpu.py --sizes small --steps 20 --repeats 1 --systems rlcore-hybrid --out-dir /tmp/ab-$tree-$i --work-dir /tmp/ab-work-$tree > /tmp/ab-$tree-$i.log 2>&1
    python3 -c "import json; d=json.load(open('/tmp/ab-$tree-$i/small.json')); print('$tree', $i, round(d['summary']['rlcore-hybrid']['median_step_s'],3), d['source'])"
  done
done
