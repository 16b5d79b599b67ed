package grammar

import (
	"fmt"
	"regexp/syntax"
	"unicode"
)

// MaxRegexBytes bounds a regular expression's text.
const MaxRegexBytes = 16 << 10

// MaxRepeat bounds a counted repetition ({n,m}) in a regular expression,
// as regexp/syntax does (1000).
const MaxRepeat = 1000

// runeFilter removes runes a context cannot hold (a JSON string's text
// holds no '"', '\\' or control characters unescaped); nil keeps all.
type runeFilter func([][2]rune) [][2]rune

// regex compiles a regular expression (Perl syntax, as Go's regexp; the
// match is of the whole text: ^ and $ at its ends are accepted) onto next.
func (n *nfa) regex(expr string, filter runeFilter, next int32) int32 {
	if len(expr) > MaxRegexBytes {
		n.fail(fmt.Errorf("the regular expression is %d bytes, at most %d", len(expr), MaxRegexBytes))
		return next
	}
	re, ok := n.parsed[expr]
	if !ok {
		p, err := syntax.Parse(expr, syntax.Perl)
		if err != nil {
			n.fail(fmt.Errorf("invalid regular expression: %v", err))
			return next
		}
		re = anchorsOff(p.Simplify())
		if n.parsed == nil {
			n.parsed = map[string]*syntax.Regexp{}
		}
		n.parsed[expr] = re
	}
	return n.re(re, filter, next)
}

// anchorsOff drops ^ at the start and $ at the end of the whole
// expression (the match is of the whole text anyway); anchors anywhere
// else are refused by re.
func anchorsOff(re *syntax.Regexp) *syntax.Regexp {
	switch re.Op {
	case syntax.OpBeginText, syntax.OpEndText:
		return &syntax.Regexp{Op: syntax.OpEmptyMatch}
	case syntax.OpConcat:
		subs := re.Sub
		if len(subs) > 0 && subs[0].Op == syntax.OpBeginText {
			subs = subs[1:]
		}
		if len(subs) > 0 && subs[len(subs)-1].Op == syntax.OpEndText {
			subs = subs[:len(subs)-1]
		}
		c := *re
		c.Sub = subs
		return &c
	}
	return re
}

func (n *nfa) re(re *syntax.Regexp, filter runeFilter, next int32) int32 {
	if n.err != nil {
		return next
	}
	sub := func(r *syntax.Regexp) func(int32) int32 {
		return func(next int32) int32 { return n.re(r, filter, next) }
	}
	switch re.Op {
	case syntax.OpEmptyMatch:
		return next
	case syntax.OpNoMatch:
		return n.add(nstate{})
	case syntax.OpLiteral:
		for i := len(re.Rune) - 1; i >= 0; i-- {
			r := re.Rune[i]
			ranges := [][2]rune{{r, r}}
			if re.Flags&syntax.FoldCase != 0 {
				for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
					ranges = append(ranges, [2]rune{f, f})
				}
			}
			next = n.runes(n.filter(ranges, filter), next)
		}
		return next
	case syntax.OpCharClass:
		var ranges [][2]rune
		for i := 0; i+1 < len(re.Rune); i += 2 {
			ranges = append(ranges, [2]rune{re.Rune[i], re.Rune[i+1]})
		}
		return n.runes(n.filter(ranges, filter), next)
	case syntax.OpAnyCharNotNL:
		return n.runes(n.filter([][2]rune{{0, '\n' - 1}, {'\n' + 1, unicode.MaxRune}}, filter), next)
	case syntax.OpAnyChar:
		return n.runes(n.filter([][2]rune{{0, unicode.MaxRune}}, filter), next)
	case syntax.OpCapture:
		return n.re(re.Sub[0], filter, next)
	case syntax.OpConcat:
		for i := len(re.Sub) - 1; i >= 0; i-- {
			next = n.re(re.Sub[i], filter, next)
		}
		return next
	case syntax.OpAlternate:
		ps := make([]func(int32) int32, len(re.Sub))
		for i, s := range re.Sub {
			ps[i] = sub(s)
		}
		return n.alt(next, ps...)
	case syntax.OpStar:
		return n.star(sub(re.Sub[0]), next)
	case syntax.OpPlus:
		return n.repeat(sub(re.Sub[0]), 1, -1, next)
	case syntax.OpQuest:
		return n.repeat(sub(re.Sub[0]), 0, 1, next)
	case syntax.OpRepeat:
		if re.Min > MaxRepeat || re.Max > MaxRepeat {
			n.fail(fmt.Errorf("a repetition count above %d in the regular expression", MaxRepeat))
			return next
		}
		return n.repeat(sub(re.Sub[0]), re.Min, re.Max, next)
	}
	n.fail(fmt.Errorf("the regular expression uses %s, which a token grammar cannot express (only ^ and $ at its ends are accepted)", opName(re.Op)))
	return next
}

func (n *nfa) filter(ranges [][2]rune, f runeFilter) [][2]rune {
	if f == nil {
		return ranges
	}
	return f(ranges)
}

func opName(op syntax.Op) string {
	switch op {
	case syntax.OpBeginLine, syntax.OpEndLine:
		return "a line anchor (^ or $ in multi-line mode)"
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return `a word boundary (\b or \B)`
	case syntax.OpBeginText, syntax.OpEndText:
		return `a text anchor inside the expression`
	}
	return fmt.Sprintf("operator %d", op)
}

// subtract removes the runes of cut from ranges.
func subtract(ranges [][2]rune, cut ...[2]rune) [][2]rune {
	out := ranges
	for _, c := range cut {
		var next [][2]rune
		for _, r := range out {
			if r[1] < c[0] || r[0] > c[1] {
				next = append(next, r)
				continue
			}
			if r[0] < c[0] {
				next = append(next, [2]rune{r[0], c[0] - 1})
			}
			if r[1] > c[1] {
				next = append(next, [2]rune{c[1] + 1, r[1]})
			}
		}
		out = next
	}
	return out
}

// jsonSafe keeps the runes a JSON string holds unescaped.
func jsonSafe(ranges [][2]rune) [][2]rune {
	return subtract(ranges, [2]rune{0, 0x1F}, [2]rune{'"', '"'}, [2]rune{'\\', '\\'})
}
