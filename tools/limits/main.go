// Command limits measures the CPU's limits that glmflash bench compares
// its figures with (internal/cpulimits): the FP32 FMA peak (AVX-512
// VFMADD231PS), the VDPBF16PS peak (AVX512_BF16 CPUs) and the read
// bandwidth, each the median of several runs on every CPU the process may
// run on. It prints a summary and writes the JSON that
// `glmflash bench --limits FILE` reads:
//
//	go run ./tools/limits                      # configs/limits/<cpu>-<threads>t.json
//	go run ./tools/limits -json /tmp/l.json -runs 11
//
// Run it on an idle machine: other processes on the same cores lower
// every figure (the spread printed beside each median shows it).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/glmflash/glmflash/internal/cpulimits"
)

func main() {
	o := cpulimits.Full()
	out := flag.String("json", "", "write the JSON here (default: configs/limits/<cpu model>-<threads>t.json; - for stdout only)")
	flag.IntVar(&o.Threads, "threads", 0, "CPUs to measure on (0: every CPU the process may run on)")
	flag.IntVar(&o.Runs, "runs", o.Runs, "timed runs per limit (the median is reported)")
	flag.DurationVar(&o.RunTime, "run-time", o.RunTime, "target duration of one compute run")
	flag.IntVar(&o.ReadPasses, "read-passes", o.ReadPasses, "passes over the read buffer per bandwidth run")
	flag.Int64Var(&o.BufferBytes, "buffer-bytes", 0, "read buffer size (0: 4× the last-level cache, at least 128 MiB)")
	flag.Parse()
	if err := run(o, *out); err != nil {
		fmt.Fprintln(os.Stderr, "limits:", err)
		os.Exit(1)
	}
}

func run(o cpulimits.Options, out string) error {
	if o.Runs < 1 || o.ReadPasses < 1 || o.RunTime <= 0 || o.Threads < 0 || o.BufferBytes < 0 {
		return fmt.Errorf("-runs and -read-passes must be ≥ 1, -run-time > 0, -threads and -buffer-bytes ≥ 0")
	}
	t0 := time.Now()
	l, err := cpulimits.Measure(o)
	if err != nil {
		return err
	}
	fmt.Printf("cpu      %s (%s), %d threads, %s\n", l.CPUModel, l.Host, l.Threads, l.GoVersion)
	fmt.Printf("limits   %s\n", l)
	fmt.Printf("method   %s\n", l.Method)
	fmt.Printf("took     %.1f s\n", time.Since(t0).Seconds())
	if out == "-" {
		return l.Save("/dev/stdout")
	}
	if out == "" {
		out = filepath.Join("configs", "limits", l.Slug()+".json")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			return err
		}
	}
	if err := l.Save(out); err != nil {
		return err
	}
	fmt.Printf("wrote    %s\n", out)
	return nil
}
