//go:build !unix

package safetensors

import "os"

func mmapFile(*os.File, int64) ([]byte, error) { return nil, errNoMmap }

func munmap([]byte) error { return nil }

func dropPages([]byte) error { return nil }
