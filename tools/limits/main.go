// Command limits measures the CPU's limits that glmflash bench compares
// its figures with (internal/cpulimits): the FP32 FMA peak (VFMADD231PS on
// AVX-512 zmm or AVX2 ymm registers), the VDPBF16PS peak (AVX512_BF16
// CPUs) and the read bandwidth, each the median of several runs on every
// CPU the process may run on. It prints a summary, naming the instruction
// set, and writes the JSON that `glmflash bench --limits FILE` reads:
//
//	go run ./tools/limits                      # configs/limits/<cpu>-<isa>-<threads>t.json
//	go run ./tools/limits -json /tmp/l.json -runs 11
//
// It never replaces a file measured on another CPU (another model name,
// instruction set or thread count): such a file is refused, naming what
// differs, unless -force is given.
//
// Run it on an idle machine: other processes on the same cores lower
// every figure (the spread printed beside each median shows it).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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
	force := flag.Bool("force", false, "replace the output file even when another CPU's measurement is in it")
	flag.Parse()
	if err := run(o, *out, *force); err != nil {
		fmt.Fprintln(os.Stderr, "limits:", err)
		os.Exit(1)
	}
}

func run(o cpulimits.Options, out string, force bool) error {
	if o.Runs < 1 || o.ReadPasses < 1 || o.RunTime <= 0 || o.Threads < 0 || o.BufferBytes < 0 {
		return fmt.Errorf("-runs and -read-passes must be ≥ 1, -run-time > 0, -threads and -buffer-bytes ≥ 0")
	}
	t0 := time.Now()
	l, err := cpulimits.Measure(o)
	if err != nil {
		return err
	}
	fmt.Printf("cpu      %s (%s), %d threads, isa %s, %s\n", l.CPUModel, l.Host, l.Threads, l.ISA, l.GoVersion)
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
	if !force {
		if err := sameCPU(out, l); err != nil {
			return err
		}
	}
	if err := l.Save(out); err != nil {
		return err
	}
	fmt.Printf("wrote    %s\n", out)
	return nil
}

// sameCPU returns an error when path holds a measurement of another CPU
// than l's (model, instruction set or threads), or a file it cannot read
// as one; nil when there is no file or it is this CPU's.
func sameCPU(path string, l *cpulimits.Limits) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var old cpulimits.Limits
	if err := json.Unmarshal(b, &old); err != nil {
		return fmt.Errorf("%s exists and is not a limits file (%v): not replaced (-force replaces it)", path, err)
	}
	var diff []string
	if old.CPUModel != l.CPUModel {
		diff = append(diff, fmt.Sprintf("cpu_model %q, this CPU %q", old.CPUModel, l.CPUModel))
	}
	if old.ISA != l.ISA {
		diff = append(diff, fmt.Sprintf("isa %q, this CPU %q", old.ISA, l.ISA))
	}
	if old.Threads != l.Threads {
		diff = append(diff, fmt.Sprintf("threads %d, now %d", old.Threads, l.Threads))
	}
	if len(diff) > 0 {
		return fmt.Errorf("%s holds another CPU's measurement (%s): not replaced; write elsewhere with -json, or -force", path, strings.Join(diff, "; "))
	}
	return nil
}
