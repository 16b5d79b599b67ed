package syncbuf

import (
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConcurrentWritesAllArrive(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100; i++ {
				_, _ = b.Write([]byte("x\n"))
				_ = b.String()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 400, strings.Count(b.String(), "x\n"))
}
