# On an H200: Nsight Compute's sections (launch, occupancy, throughput, warp state, scheduler,
# instructions, source counters) for the attention kernels of one op's forward+backward
# (benchmarks/op_trace.py): occupancy, issue-slot use, warp stall reasons and
# the SASS lines with the most stall samples, per kernel.
#   OPS="fpa:fox fox" SHAPE=8,2048,12,64 bash benchmarks/gpu/ncu_full.sh
# (op:fields; fields as in op_trace.py; KERNELS: a kernel-name regex, COUNT: launches to profile;
# benchmarks/ncu_sass_hotspots.py summarises the SASS page). Writes $OUT/ncu_<op>_<fields>.txt (details page and
# the stall-reason metrics), ncu_<op>_<fields>_sass.csv.gz (per-kernel SASS source page) and
# the .ncu-rep reports.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
sections=""
for section in ${SECTIONS:-LaunchStats Occupancy SpeedOfLight ComputeWorkloadAnalysis MemoryWorkloadAnalysis \
    WarpStateStats SchedulerStats InstructionStats SourceCounters}; do
  sections="$sections --section $section"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for entry in ${OPS:-fpa:fox fox}; do
  op=${entry%%:*}; fields=${entry#*:}; [ "$fields" = "$entry" ] && fields=walk
  name=${op}_${fields}
  kernels=$([ "$op" = fpa ] && echo 4 || echo 3)
  timeout ${LIMIT:-200} $NCU $sections --import-source no --clock-control none \
    -k regex:${KERNELS:-attention} --launch-count ${COUNT:-$kernels} --export $OUT/ncu_$name -f \
    python3 benchmarks/op_trace.py $op --shape ${SHAPE:-8,2048,12,64} --fields $fields \
      --repeats 1 --out /tmp > /tmp/ncu_$name.log 2>&1
  echo "== $name rc=$?"; tail -3 /tmp/ncu_$name.log
  rep=$OUT/ncu_$name.ncu-rep
  { $NCU -i $rep --page details --print-units base
    $NCU -i $rep --page raw --csv | python3 benchmarks/ncu_sass_hotspots.py --raw - --top 14
  } > $OUT/ncu_$name.txt 2>&1
  grep -E "^  [a-z_]*attention|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Issue Slots Busy|Executed Ipc Active|Local Memory Spilling|Block Limit" $OUT/ncu_$name.txt | head -60
  sed -n '/^-- /,$p' $OUT/ncu_$name.txt | head -70
  $NCU -i $rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/ncu_${name}_sass.csv.gz
  python3 benchmarks/ncu_sass_hotspots.py $OUT/ncu_${name}_sass.csv.gz --top ${HOT:-15}
done
[ -n "$TRACE" ] && for op in fpa fox softmax; do
  timeout 120 python3 benchmarks/op_trace.py $op --shape ${SHAPE:-8,2048,12,64} --fields fox,flat \
    --top 8 --out /tmp 2>&1 | grep -v Warning
done | tee $OUT/op_traces.txt
