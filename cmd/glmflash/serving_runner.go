package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/glmflash/glmflash/core/attrib"
	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/host"
	v1 "github.com/glmflash/glmflash/proto/glmflash/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// servingRunner measures arms against real `glmflash serve` processes: one
// per arm, each with the arm's engine configuration, on a loopback port,
// driven over gRPC with concurrent streams.
type servingRunner struct {
	device   string
	configs  []string // the --config files every arm's server starts from
	st       *attrib.Study
	modelDir string
	binary   string
	sum      []byte // the expected SHA-256 of a binary the study names (nil: this executable)
	tmp      string
	mu       sync.Mutex
	arms     map[string]*armServer
}

type armServer struct {
	cmd   *exec.Cmd
	conn  *grpc.ClientConn
	cli   v1.GLMFlashClient
	info  attrib.ArmInfo
	done  chan struct{}
	stder *strings.Builder
}

func newServingRunner(st *attrib.Study, modelDir, device string, configs []string) (attrib.Runner, error) {
	bin := st.Serving.Binary
	var sum []byte
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		bin = self
	} else {
		// an executable the study names runs only with its checksum
		// (attrib.Study.Validate requires serving.binary_sha256 with it)
		var err error
		if sum, err = hex.DecodeString(st.Serving.BinarySHA256); err != nil || len(sum) != sha256.Size {
			return nil, fmt.Errorf("serving.binary_sha256: %q is not a hex SHA-256", st.Serving.BinarySHA256)
		}
		_, release, err := host.VerifiedExecutable(bin, sum) // refused before any arm starts
		if err != nil {
			return nil, fmt.Errorf("serving.binary: %w", err)
		}
		release()
	}
	// The arm's serve config lives in a temporary folder, and paths in a
	// config file are relative to the file.
	modelDir, err := filepath.Abs(modelDir)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "glmflash-study-")
	if err != nil {
		return nil, err
	}
	var abs []string
	for _, c := range configs {
		a, err := filepath.Abs(c)
		if err != nil {
			return nil, err
		}
		abs = append(abs, a)
	}
	return &servingRunner{device: device, configs: abs, st: st, modelDir: modelDir, binary: bin, sum: sum, tmp: tmp, arms: map[string]*armServer{}}, nil
}

var addrRE = regexp.MustCompile(`serving glmflash\.v1\.GLMFlash on (\S+) `)

// Prepare starts the arm's server and waits until it serves.
func (r *servingRunner) Prepare(ctx context.Context, a attrib.Arm) error {
	conc, reqs := 1, 1
	for _, w := range r.st.Workloads {
		reqs = max(reqs, w.Requests)
		for _, c := range w.Concurrency {
			conc = max(conc, c)
		}
	}
	safe := strings.NewReplacer("+", "plus-", "-", "minus-", "/", "_").Replace(a.Name)
	rt := map[string]any{"slots": conc, "max_running": conc, "max_queue": reqs}
	if r.st.Runtime.MaxBatchTokens > 0 {
		rt["max_batch_tokens"] = r.st.Runtime.MaxBatchTokens
	}
	if r.st.Runtime.PrefillChunk > 0 {
		rt["prefill_chunk"] = r.st.Runtime.PrefillChunk
	}
	// the arm's configuration, over the --config files of the study's
	// command: its passes (and the study's plugins), the model, loopback
	// listeners, the runtime sized for the study
	ac := map[string]any{
		"passes":  absolutePaths(a.Passes),
		"model":   map[string]any{"dir": r.modelDir},
		"server":  map[string]any{"grpc_addr": "127.0.0.1:0", "http_addr": "", "metrics_addr": ""},
		"runtime": rt,
	}
	if r.st.Plugins.Dir != "" {
		ac["plugins"] = r.st.Plugins
	}
	if r.st.Precision != "" {
		ac["precision"] = r.st.Precision
	}
	if r.st.CUDA != nil {
		ac["cuda"] = map[string]any{"graph_max_tokens": r.st.CUDA.GraphMaxTokens}
	}
	path := filepath.Join(r.tmp, safe+".yaml")
	if err := writeJSON(path, passConfigsAsYAML(ac)); err != nil {
		return err
	}
	argv := []string{"serve", "--device", r.device, "--log-level", "warn"}
	for _, c := range append(r.configs, path) {
		argv = append(argv, "--config", c)
	}
	cmd, release, err := r.command(argv)
	if err != nil {
		return fmt.Errorf("arm %s: serving.binary: %w", a.Name, err)
	}
	defer release()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &lockedWriter{w: &stderr}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("arm %s: starting %s serve: %w", a.Name, r.binary, err)
	}
	as := &armServer{cmd: cmd, done: make(chan struct{}), stder: &stderr}
	r.mu.Lock()
	r.arms[a.Name] = as
	r.mu.Unlock()
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := addrRE.FindStringSubmatch(sc.Text()); m != nil {
				addrc <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stdout) // drained until the server exits
	}()
	go func() {
		_ = cmd.Wait() // its exit is reported through as.done and the stderr kept
		close(as.done)
	}()
	timeout := time.Duration(r.st.Serving.StartTimeoutS) * time.Second
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	var addr string
	select {
	case addr = <-addrc:
	case <-as.done:
		return fmt.Errorf("arm %s: server exited before serving: %s", a.Name, stderr.String())
	case <-time.After(timeout):
		return fmt.Errorf("arm %s: server did not start within %s", a.Name, timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	as.conn, as.cli = conn, v1.NewGLMFlashClient(conn)
	// warm the programs up, then read which passes fired
	if err := r.generate(ctx, as, []int32{1, 2, 3}, 2, func([]int32) {}); err != nil {
		return fmt.Errorf("arm %s: warm-up request: %w", a.Name, err)
	}
	as.info = attrib.ArmInfo{ConfigHash: attrib.ConfigHash(r.st.Model, a.Passes)}
	mi, err := as.cli.GetModelInfo(ctx, &v1.GetModelInfoRequest{})
	if err == nil && mi.PassReportJson != "" {
		as.info.Fired = firedFromReport(mi.PassReportJson)
		as.info.Failed = failedFromReport(mi.PassReportJson)
	}
	return nil
}

// command is an arm server's command: the binary with a clean, explicit
// environment (Study.ArmEnv: the system's variables and serving.env, none
// of this process's GLMFLASH_ variables, which overrode the arm's
// configuration).
func (r *servingRunner) command(argv []string) (*exec.Cmd, func(), error) {
	cmd, release := exec.Command(r.binary, argv...), func() {}
	if r.sum != nil { // checked again at every start: what runs is what was hashed
		var err error
		if cmd, release, err = host.VerifiedExecutable(r.binary, r.sum, argv...); err != nil {
			return nil, nil, err
		}
	}
	cmd.Env = r.st.ArmEnv(os.Environ())
	return cmd, release, nil
}

// absolutePaths makes the relative path options of built-in passes
// absolute (against the directory of the file they were written in): the
// arm's file lives elsewhere.
func absolutePaths(ps []config.PassConfig) []config.PassConfig {
	out := make([]config.PassConfig, len(ps))
	for i, p := range ps {
		out[i] = p
		r, ok := pass.Lookup(p.Name)
		if !ok || p.Dir == "" {
			continue
		}
		schema, _ := r.Schema()
		for _, o := range schema {
			if v, ok := p.Options[o.Name].(string); ok && o.Type == pass.PathType && v != "" && !filepath.IsAbs(v) {
				out[i].Options = maps.Clone(out[i].Options)
				out[i].Options[o.Name] = filepath.Join(p.Dir, v)
			}
		}
	}
	return out
}

// passConfigsAsYAML turns config structs into plain maps with YAML keys.
func passConfigsAsYAML(ec map[string]any) map[string]any {
	b, _ := json.Marshal(ec) // maps of config structs always marshal
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err) // what json.Marshal wrote
	}
	if ps, ok := m["passes"].([]any); ok {
		for _, p := range ps {
			pm := p.(map[string]any)
			for k, v := range pm {
				delete(pm, k)
				pm[strings.ToLower(k)] = v
			}
			if pm["enabled"] == nil {
				delete(pm, "enabled")
			}
			if pm["options"] == nil {
				delete(pm, "options")
			}
		}
	}
	if pl, ok := m["plugins"].(map[string]any); ok {
		out := map[string]any{}
		keys := map[string]string{"Dir": "dir", "Checksums": "checksums", "SumsFile": "sums_file", "TimeoutMS": "timeout_ms", "StartTimeoutMS": "start_timeout_ms", "AllowUnverified": "allow_unverified"}
		for k, v := range pl {
			if nk, ok := keys[k]; ok && v != nil && v != "" {
				out[nk] = v
			}
		}
		m["plugins"] = out
	}
	return m
}

// firedFromReport extracts fired pass names from GetModelInfo's report.
func firedFromReport(js string) []string {
	var rep struct {
		Programs map[string]struct {
			Passes []struct {
				Name  string `json:"name"`
				Fired []any  `json:"fired"`
			} `json:"passes"`
		} `json:"programs"`
	}
	if json.Unmarshal([]byte(js), &rep) != nil {
		return nil
	}
	set := map[string]bool{}
	for _, p := range rep.Programs {
		for _, ps := range p.Passes {
			if len(ps.Fired) > 0 {
				set[ps.Name] = true
			}
		}
	}
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}

// failedFromReport extracts the FAILED passes of GetModelInfo's report
// (attrib.ArmInfo.Failed); a report that does not decode is one failure.
func failedFromReport(js string) []string {
	var rep struct {
		Programs map[string]*pass.Report `json:"programs"`
	}
	if err := json.Unmarshal([]byte(js), &rep); err != nil {
		return []string{"the arm's pass report: " + err.Error()}
	}
	reps := make([]*pass.Report, 0, len(rep.Programs))
	for _, r := range rep.Programs {
		if r != nil {
			reps = append(reps, r)
		}
	}
	return attrib.FailedPasses(reps)
}

func (r *servingRunner) generate(ctx context.Context, as *armServer, prompt []int32, maxTokens int, on func([]int32)) error {
	mt := uint32(maxTokens)
	temp := 0.0
	stream, err := as.cli.Generate(ctx, &v1.GenerateRequest{PromptIds: prompt, MaxTokens: &mt, Sampling: &v1.SamplingParams{Temperature: &temp}, IgnoreEos: true})
	if err != nil {
		return err
	}
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if t := msg.GetToken(); t != nil {
			on([]int32{t.Id})
		}
		if f := msg.GetFinish(); f != nil {
			if r := f.GetReason().String(); !strings.Contains(r, "LENGTH") && !strings.Contains(r, "STOP") {
				return fmt.Errorf("request finished with %s: %s", r, f.GetMessage())
			}
		}
	}
}

// RunCell implements attrib.Runner.
func (r *servingRunner) RunCell(ctx context.Context, a attrib.Arm, c attrib.Cell, prompts [][]int32) (*attrib.CellResult, error) {
	r.mu.Lock()
	as := r.arms[a.Name]
	r.mu.Unlock()
	gen := func(ctx context.Context, p []int32, n int, on func([]int32)) error {
		return r.generate(ctx, as, p, n, on)
	}
	return attrib.Drive(ctx, gen, prompts, c.Workload.OutputLen, c.Concurrency), nil
}

// Info implements attrib.Runner.
func (r *servingRunner) Info(a attrib.Arm) attrib.ArmInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	if as := r.arms[a.Name]; as != nil {
		return as.info
	}
	return attrib.ArmInfo{}
}

// Close stops every server (SIGTERM, then kill after 10 s).
func (r *servingRunner) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, as := range r.arms {
		if as.conn != nil {
			as.conn.Close()
		}
		if as.cmd.Process != nil {
			as.cmd.Process.Signal(os.Interrupt)
			select {
			case <-as.done:
			case <-time.After(10 * time.Second):
				as.cmd.Process.Kill()
				<-as.done
			}
		}
	}
	return os.RemoveAll(r.tmp)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
