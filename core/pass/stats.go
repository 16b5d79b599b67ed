package pass

import (
	"fmt"
	"reflect"
)

// Statistic is a named counter a pass reports with its Result (MLIR's
// Statistic): reports and `passes explain` show it beside the fired sites.
type Statistic struct {
	Name  string `json:"name"`
	Value int64  `json:"value"`
	Doc   string `json:"doc,omitempty"`
}

// Counters turns a pass's statistics struct into Statistics. A pass declares
// its counters once, as int fields tagged with their name and meaning:
//
//	type Stats struct {
//		NodesRemoved int `stat:"nodes_removed" doc:"nodes the rewrite made dead"`
//	}
//
// and returns Result{Stats: pass.Counters(&st)}. Untagged fields are
// ignored; a tagged field of another type is a programming error (panic).
func Counters(stats any) []Statistic {
	v := reflect.Indirect(reflect.ValueOf(stats))
	t := v.Type()
	var out []Statistic
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, ok := f.Tag.Lookup("stat")
		if !ok {
			continue
		}
		var n int64
		switch f.Type.Kind() {
		case reflect.Int, reflect.Int32, reflect.Int64:
			n = v.Field(i).Int()
		default:
			panic(fmt.Sprintf("pass: statistic %s (%s.%s) must be an integer, is %s", name, t, f.Name, f.Type))
		}
		out = append(out, Statistic{Name: name, Value: n, Doc: f.Tag.Get("doc")})
	}
	return out
}
