package model

import (
	"errors"
	"fmt"

	"github.com/glmflash/glmflash/model/safetensors"
)

// NewGenerated returns a checkpoint over cfg whose tensors are made in
// memory (safetensors.NewGenerated files) instead of read from a directory:
// dummy weights (model.load_format: dummy). Everything a reader of a
// Checkpoint asks works as on one read from disk (Raw, Float32,
// FP8Scales, Validate, CheckTensors); source describes the weights in
// messages and reports (Source), and dir is the directory the config and
// tokenizer came from ("" for a preset: Dir). cfg must be valid; the files
// must hold distinct tensors and be generated.
func NewGenerated(cfg *Config, source, dir string, files ...*safetensors.File) (*Checkpoint, error) {
	if cfg == nil {
		return nil, errors.New("generated checkpoint: nil config")
	}
	if source == "" {
		return nil, errors.New("generated checkpoint: no source description")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ck := &Checkpoint{dir: dir, source: source, cfg: cfg, mode: safetensors.Generated, tensors: map[string]tensorLoc{}}
	for _, f := range files {
		if !f.Generated() {
			return nil, fmt.Errorf("generated checkpoint %s: file %s is not generated", source, f.Path())
		}
		ck.files = append(ck.files, f)
		for name, info := range f.Tensors() {
			if _, dup := ck.tensors[name]; dup {
				return nil, fmt.Errorf("generated checkpoint %s: tensor %s is generated twice", source, name)
			}
			ck.tensors[name] = tensorLoc{file: f, info: info}
		}
	}
	return ck, nil
}

// Generated reports whether the weights are made in memory (NewGenerated:
// random dummy weights) rather than read from a checkpoint.
func (ck *Checkpoint) Generated() bool { return ck.source != "" }

// Source describes the weights: the description NewGenerated was given for
// generated ones, else the checkpoint's directory.
func (ck *Checkpoint) Source() string { return ck.where() }

// where names the checkpoint in messages.
func (ck *Checkpoint) where() string {
	if ck.source != "" {
		return ck.source
	}
	return ck.dir
}

// Release says that the caller no longer reads the bytes Raw handed out
// for the named tensor (plan.ReleasableWeights): generated tensors none of
// whose slices is held any more are freed (and made again, the same, when
// asked for later). Tensors read from files stay until Close.
func (ck *Checkpoint) Release(name string) {
	if loc, ok := ck.tensors[name]; ok {
		loc.file.Release(name)
	}
}

// ResidentBytes is the memory the checkpoint's tensor bytes take now: the
// files' copies (model.weights: copy), the generated tensors filled and not
// released; 0 for mappings (their pages are the page cache's).
func (ck *Checkpoint) ResidentBytes() int64 {
	var n int64
	for _, f := range ck.files {
		n += f.ResidentBytes()
	}
	return n
}

// Fills is how many times generated tensor groups were made (an FP8 weight
// and its block scale are one; a group released and read again counts
// again); 0 for a checkpoint read from disk.
func (ck *Checkpoint) Fills() int64 {
	var n int64
	for _, f := range ck.files {
		n += f.Fills()
	}
	return n
}

// TensorBytes is the stored size of every tensor (what the checkpoint's
// safetensors data takes, or would take for generated weights).
func (ck *Checkpoint) TensorBytes() int64 {
	var n int64
	for _, loc := range ck.tensors {
		n += loc.info.End - loc.info.Begin
	}
	return n
}

// Fill makes every generated tensor now, workers at a time
// (safetensors.File.Fill): for a reader that reads them all and keeps them
// (the CPU backend), this uses every core where reading them one at a time
// would not. Nothing happens for a checkpoint read from disk.
func (ck *Checkpoint) Fill(workers int) error {
	for _, f := range ck.files {
		if err := f.Fill(workers); err != nil {
			return err
		}
	}
	return nil
}
