// Command cudaargs regenerates kernels/cuda/args_gen.go, the Go mirrors of
// the CUDA kernels' argument structs (make cuda-args).
package main

import (
	"fmt"
	"os"

	"github.com/glmflash/glmflash/kernels/cuda/argsgen"
)

func main() {
	b, err := argsgen.Generate("kernels/cuda/src", "cuda")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cudaargs:", err)
		os.Exit(1)
	}
	if err := os.WriteFile("kernels/cuda/args_gen.go", b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "cudaargs:", err)
		os.Exit(1)
	}
}
