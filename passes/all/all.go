// Package all registers every built-in pass; import it for its side effect.
package all

import (
	// built-in passes register themselves in init
	_ "github.com/glmflash/glmflash/passes/autotune"
	_ "github.com/glmflash/glmflash/passes/dsameta"
	_ "github.com/glmflash/glmflash/passes/gateup"
	_ "github.com/glmflash/glmflash/passes/hostlen"
	_ "github.com/glmflash/glmflash/passes/kdafusion"
	_ "github.com/glmflash/glmflash/passes/mhcfusion"
	_ "github.com/glmflash/glmflash/passes/sharedoverlap"
)
