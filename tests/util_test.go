package tests

import "strconv"

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'e', 1, 64) }
