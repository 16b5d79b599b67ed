package cpulimits

import "golang.org/x/sys/unix"

// allowedCPUs lists the CPUs the process may run on (nil when unknown).
func allowedCPUs() []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cpus []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// pin restricts the calling OS thread to cpu (best effort: a refusal
// leaves the thread where the scheduler puts it).
func pin(cpu int) {
	var set unix.CPUSet
	set.Set(cpu)
	_ = unix.SchedSetaffinity(0, &set)
}

// threadCPUSeconds is the calling thread's user + system CPU time.
func threadCPUSeconds() float64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}
