package pass

import (
	"fmt"
	"regexp"
)

// MaxNameLength bounds a pass name.
const MaxNameLength = 64

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`)

// CheckName checks a pass name, built-in or a plugin's: lower-case ASCII
// words of letters and digits joined by single hyphens, starting with a
// letter, at most MaxNameLength bytes ("mlp-gate-up-fusion"). A name
// appears in configuration keys, file names, logs and Markdown reports, so
// nothing else is allowed in it.
func CheckName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("pass name is empty")
	case len(name) > MaxNameLength:
		return fmt.Errorf("pass name %.20q… is %d bytes, more than %d", name, len(name), MaxNameLength)
	case !nameRE.MatchString(name):
		return fmt.Errorf("pass name %q must be lower-case words of ASCII letters and digits joined by single hyphens, starting with a letter (like mlp-gate-up-fusion)", name)
	}
	return nil
}
