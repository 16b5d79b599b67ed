//go:build !linux

package cpulimits

// allowedCPUs is unknown off Linux: threads are not pinned.
func allowedCPUs() []int { return nil }

// pin does nothing off Linux.
func pin(int) {}

// threadCPUSeconds is unknown off Linux.
func threadCPUSeconds() float64 { return 0 }
