package randckpt

import (
	"testing"
)

// Run with: go test -run XXX -bench WritePreset ./model/randckpt/
func BenchmarkWritePreset(b *testing.B) {
	for _, name := range []string{"small", "bench"} {
		for _, fp8 := range []bool{false, true} {
			cfg, err := Preset(name)
			if err != nil {
				b.Fatal(err)
			}
			tag := name
			if fp8 {
				tag += "-fp8"
			}
			b.Run(tag, func(b *testing.B) {
				dir := b.TempDir()
				for b.Loop() {
					if err := Write(dir, cfg, Options{Seed: 1, FP8: fp8}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
