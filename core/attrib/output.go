package attrib

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Output is a study's destination, checked before anything is measured.
// Runs are never mixed: the directory must not exist or be empty. The
// files are written into a private staging folder beside it and renamed
// into place at once when the study is done, so a reader sees all of a
// run's files or none, and a failed run leaves nothing behind.
type Output struct {
	// Dir is where the files end up.
	Dir     string
	staging string
}

// PrepareOutput checks dir and creates its staging folder (which proves the
// parent is writable). Errors name the directory.
func PrepareOutput(dir string) (*Output, error) {
	if dir == "" {
		return nil, errors.New("output directory: empty path")
	}
	dir = filepath.Clean(dir)
	st, err := os.Stat(dir)
	switch {
	case err == nil && !st.IsDir():
		return nil, fmt.Errorf("output directory %s exists and is not a directory", dir)
	case err == nil:
		ents, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("output directory %s: %w", dir, err)
		}
		if len(ents) > 0 {
			return nil, fmt.Errorf("output directory %s already holds %d entries (an earlier run?): choose a new or empty directory, runs are never mixed", dir, len(ents))
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("output directory %s: %w", dir, err)
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("output directory %s: %w", dir, err)
	}
	staging, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return nil, fmt.Errorf("output directory %s is not writable: %w", dir, err)
	}
	return &Output{Dir: dir, staging: staging}, nil
}

// Commit writes the result's files into the staging folder and moves it
// into place, returning the files (under Dir) and the summary.
func (o *Output) Commit(r *Result) ([]string, *Summary, error) {
	files, sum, err := r.WriteAll(o.staging)
	if err != nil {
		o.Abort()
		return nil, sum, fmt.Errorf("writing the study's output: %w", err)
	}
	// rename(2) replaces an empty directory; a non-empty one (another run
	// that appeared meanwhile) makes it fail, and nothing is mixed
	if err := os.Rename(o.staging, o.Dir); err != nil {
		o.Abort()
		return nil, sum, fmt.Errorf("output directory %s: %w", o.Dir, err)
	}
	for i, f := range files {
		files[i] = filepath.Join(o.Dir, filepath.Base(f))
	}
	return files, sum, nil
}

// Abort removes the staging folder (safe to call more than once).
func (o *Output) Abort() { os.RemoveAll(o.staging) }
