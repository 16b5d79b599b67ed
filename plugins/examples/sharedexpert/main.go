// Command glmflash-pass-shared-expert-fusion is the example pass plugin:
// the shared-expert-fusion pass (package fusion) served to the engine.
//
//	go build -o bin/plugins/glmflash-pass-shared-expert-fusion ./plugins/examples/sharedexpert
package main

import (
	"github.com/glmflash/glmflash/plugins/examples/sharedexpert/fusion"
	"github.com/glmflash/glmflash/plugins/sdk"
)

func main() { sdk.Serve(fusion.Description, fusion.New()) }
