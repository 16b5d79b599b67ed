package main

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/hashicorp/go-plugin"

	"github.com/glmflash/glmflash/core/config"
	"github.com/glmflash/glmflash/core/pass"
	"github.com/glmflash/glmflash/plugins/host"
)

var (
	pluginMu     sync.Mutex
	pluginHosts  []*host.Host
	pluginSignal sync.Once
	// exitOnSignal makes SIGINT/SIGTERM stop plugins and exit at once;
	// serve turns it off because it drains first and stops plugins after.
	exitOnSignal = true
)

// pipelineWithPlugins builds the pass pipeline of ec: the enabled entries of
// passes:, in their order, resolved among the built-in passes and the plugin
// passes discovered in plugins.dir (verified, started, described). Plugins
// whose pass is not requested are stopped again; the others run until the
// command ends (closePlugins).
func pipelineWithPlugins(ec *config.Config) (*pass.Pipeline, error) {
	if ec.Plugins.Dir == "" {
		return ec.Pipeline(nil)
	}
	pluginSignal.Do(func() {
		if !exitOnSignal {
			return // serve and attribute handle signals (withSignals)
		}
		// an interrupted command still stops its plugin processes, also
		// while they start
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
		go func() {
			<-ch
			host.KillAll()
			os.Exit(130)
		}()
	})
	h, err := host.Open(host.OptionsFromConfig(ec, log))
	if err != nil {
		return nil, err
	}
	pluginMu.Lock()
	pluginHosts = append(pluginHosts, h)
	pluginMu.Unlock()
	pl, err := ec.Pipeline(h)
	if err != nil {
		return nil, err
	}
	var keep []string
	for _, p := range ec.Enabled() {
		keep = append(keep, p.Name)
	}
	h.StopUnused(keep)
	return pl, nil
}

// closePlugins stops every plugin process this command started.
func closePlugins() {
	pluginMu.Lock()
	hs := pluginHosts
	pluginHosts = nil
	pluginMu.Unlock()
	for _, h := range hs {
		h.Close()
	}
	host.KillAll() // anything a host could not stop
	plugin.CleanupClients()
}
