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
// run's files or none, and a failed run leaves nothing behind. A study
// holds a lock on the destination (.NAME.lock beside it) from the check to
// the commit: a second study given the same directory is refused at once,
// before it measures anything, instead of losing its results to the first
// one's rename at the end (issue 37). Refusing is chosen over writing into
// distinct subfolders because the operator named one directory for one
// run; the lock dies with its process (flock), so a killed study leaves no
// stale lock.
type Output struct {
	// Dir is where the files end up.
	Dir     string
	staging string
	lock    *os.File
}

// errBusy is lockFile's answer when another study holds the lock.
var errBusy = errors.New("locked")

// LockName is the lock file of an output directory dir, beside it.
func LockName(dir string) string {
	dir = filepath.Clean(dir)
	return filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".lock")
}

// PrepareOutput checks dir and creates its staging folder (which proves the
// parent is writable), holding dir's lock until Commit or Abort. Errors
// name the directory.
func PrepareOutput(dir string) (*Output, error) {
	if dir == "" {
		return nil, errors.New("output directory: empty path")
	}
	dir = filepath.Clean(dir)
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		return nil, fmt.Errorf("output directory %s exists and is not a directory", dir)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, fmt.Errorf("output directory %s: %w", dir, err)
	}
	lock, err := lockFile(LockName(dir))
	switch {
	case errors.Is(err, errBusy):
		return nil, fmt.Errorf("output directory %s is being written by another study (it holds %s): give each study its own --out", dir, LockName(dir))
	case err != nil:
		return nil, fmt.Errorf("output directory %s is not writable: %w", dir, err)
	}
	o, err := prepareLocked(dir)
	if err != nil {
		unlock(lock, dir)
		return nil, err
	}
	o.lock = lock
	return o, nil
}

// unlock releases and removes dir's lock file.
func unlock(f *os.File, dir string) {
	if f == nil {
		return
	}
	os.Remove(LockName(dir)) // before the close: a waiting study then locks a fresh file
	f.Close()
}

func prepareLocked(dir string) (*Output, error) {
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
	unlock(o.lock, o.Dir)
	o.lock = nil
	for i, f := range files {
		files[i] = filepath.Join(o.Dir, filepath.Base(f))
	}
	return files, sum, nil
}

// Abort removes the staging folder and releases the lock (safe to call
// more than once, and after Commit).
func (o *Output) Abort() {
	os.RemoveAll(o.staging)
	unlock(o.lock, o.Dir)
	o.lock = nil
}
