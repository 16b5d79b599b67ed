package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizer regex of Qwen2/3, GLM-4 and Llama 3 (the last two with
// \p{N}{1,3}) dominates encoding time in the general regex engine; these
// hand-written matchers do exactly what the backtracking engine does with
// them (FuzzFastSplit checks them against it), about ten times faster.
const (
	qwenPattern   = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// fastSplit is the matcher of one of those patterns; maxDigits is 1 or 3.
type fastSplit struct{ maxDigits int }

func fastMatcher(expr string) (matcher, bool) {
	switch expr {
	case qwenPattern:
		return fastSplit{1}, true
	case llama3Pattern:
		return fastSplit{3}, true
	}
	return nil, false
}

const (
	clsSpace = 1 << iota // \s (Unicode White_Space)
	clsLetter
	clsNumber
	clsNewline // \r or \n
)

var asciiClass [utf8.RuneSelf]uint8

func init() {
	for c := 0; c < utf8.RuneSelf; c++ {
		asciiClass[c] = classOfSlow(rune(c))
	}
}

func classOfSlow(r rune) uint8 {
	var k uint8
	if unicode.Is(unicode.White_Space, r) {
		k |= clsSpace
	}
	if unicode.IsLetter(r) {
		k |= clsLetter
	}
	if unicode.IsNumber(r) {
		k |= clsNumber
	}
	if r == '\r' || r == '\n' {
		k |= clsNewline
	}
	return k
}

// at returns the class and size of the character at s[i:].
func at(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return classOfSlow(r), n
}

func (f fastSplit) findAll(_ *encoder, s string) [][2]int {
	out := make([][2]int, 0, len(s)/4+1)
	for i := 0; i < len(s); {
		if e := f.match(s, i); e > i {
			out = append(out, [2]int{i, e})
			i = e
			continue
		}
		_, n := at(s, i)
		i += n
	}
	return out
}

// match returns the end of the match at i, or i when no alternative
// matches there.
func (f fastSplit) match(s string, i int) int {
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[i] == '\'' && i+1 < len(s) {
		c := s[i+1] | 0x20
		switch c {
		case 's', 't', 'm', 'd':
			return i + 2
		case 'r', 'v', 'l':
			if i+2 < len(s) {
				want := byte('e')
				if c == 'l' {
					want = 'l'
				}
				if s[i+2]|0x20 == want {
					return i + 3
				}
			}
		}
	}
	k0, n0 := at(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	j := i
	if k0&(clsNewline|clsLetter|clsNumber) == 0 {
		j = i + n0
	}
	if e := letters(s, j); e > j {
		return e
	}
	if k0&clsLetter != 0 {
		return letters(s, i)
	}
	// \p{N} or \p{N}{1,3}
	if k0&clsNumber != 0 {
		e := i
		for d := 0; d < f.maxDigits && e < len(s); d++ {
			k, n := at(s, e)
			if k&clsNumber == 0 {
				break
			}
			e += n
		}
		return e
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j = i
	if s[i] == ' ' {
		j = i + 1
	}
	e := j
	for e < len(s) {
		k, n := at(s, e)
		if k&(clsSpace|clsLetter|clsNumber) != 0 {
			break
		}
		e += n
	}
	if e > j {
		for e < len(s) && (s[e] == '\r' || s[e] == '\n') {
			e++
		}
		return e
	}
	if k0&clsSpace == 0 {
		return i
	}
	// The whitespace run at i.
	end, lastNL := i, -1
	for end < len(s) {
		k, n := at(s, end)
		if k&clsSpace == 0 {
			break
		}
		if k&clsNewline != 0 {
			lastNL = end
		}
		end += n
	}
	// \s*[\r\n]+: up to and including the run's last newline.
	if lastNL >= 0 {
		return lastNL + 1
	}
	// \s+(?!\S): the run, less its last character when text follows.
	if end == len(s) {
		return end
	}
	if _, last := utf8.DecodeLastRuneInString(s[i:end]); end-last > i {
		return end - last
	}
	// \s+
	return end
}

// letters returns the end of the run of letters at j.
func letters(s string, j int) int {
	for j < len(s) {
		k, n := at(s, j)
		if k&clsLetter == 0 {
			break
		}
		j += n
	}
	return j
}
