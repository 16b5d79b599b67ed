// Package configs embeds glmflash's shipped configuration files, so that
// their defaults exist once and every command works from any directory:
// engine.yaml and serve.yaml are the built-in defaults (core/config loads
// them under every configuration file), presets/ and studies/ the examples.
package configs

import "embed"

// FS holds the shipped YAML files, by their path under configs/.
//
//go:embed *.yaml presets/*.yaml studies/*.yaml
var FS embed.FS

// Defaults are the files of FS that make the built-in configuration, in the
// order they are loaded.
var Defaults = []string{"engine.yaml", "serve.yaml"}
