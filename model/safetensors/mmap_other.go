//go:build !unix

package safetensors

import "os"

func mmapFile(*os.File, int64) ([]byte, error) { return nil, errNoMmap }

func munmap([]byte) error { return nil }

func dropPages([]byte) error { return nil }

func allocCopy(int64) ([]byte, func([]byte) error, error) { return nil, nil, errNoMmap }

func sealCopy([]byte) error { return nil }

func identityOf(f *os.File) (identity, error) {
	st, err := f.Stat()
	if err != nil {
		return identity{}, err
	}
	return identity{size: st.Size(), mtime: st.ModTime().UnixNano()}, nil
}
