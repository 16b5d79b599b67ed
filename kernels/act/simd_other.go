//go:build !amd64 || purego

package act

func simdImpls() []*vecImpl { return nil }
