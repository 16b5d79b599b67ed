// Package reasoning splits a model's output into its reasoning and its
// answer, incrementally (for streaming), as vLLM's glm45 reasoning parser
// does: the text between <think> and </think> is the reasoning
// (reasoning_content), the rest the content.
//
// A block opens only at the very start of the output (white space before
// it aside) or, when the prompt already opened it (a template whose
// generation prompt ends with <think>), before the first byte; once the
// answer has begun, a later <think> is text of the answer. The white
// space between </think> and the answer is dropped. An output that ends
// inside the block is reasoning throughout (the answer is empty).
//
// Feeding the output whole or in pieces split anywhere gives the same
// reasoning and content (TestSplitAnywhere).
package reasoning

import (
	"fmt"
	"strings"
)

// Formats are the values of the reasoning-parser setting.
const (
	FormatNone  = "none"  // no parser: the output is all content
	FormatGLM45 = "glm45" // <think>…</think>
)

// Formats lists the formats, in the order errors name them.
var Formats = []string{FormatNone, FormatGLM45}

// Check refuses an unknown format.
func Check(format string) error {
	for _, f := range Formats {
		if f == format {
			return nil
		}
	}
	return fmt.Errorf("%q is not a reasoning parser (have %s)", format, strings.Join(Formats, ", "))
}

// The tags of a reasoning block.
const (
	Open  = "<think>"
	Close = "</think>"
)

// PromptOpens reports whether a rendered prompt ends inside a reasoning
// block (its generation prompt ends with <think>): the output then starts
// in the reasoning.
func PromptOpens(prompt string) bool {
	return strings.HasSuffix(strings.TrimRight(prompt, " \t\r\n"), Open)
}

type state int

const (
	start     state = iota // nothing but white space yet: a block may open
	inside                 // in the block
	after                  // after </think>: white space is dropped
	answering              // the answer: everything is content
)

// Parser splits one output; it is used by one goroutine.
type Parser struct {
	st  state
	buf string // held text: white space at the start, a possible tag prefix
}

// New returns a parser for an output whose prompt opened a block (inside)
// or not.
func New(opened bool) *Parser {
	if opened {
		return &Parser{st: inside}
	}
	return &Parser{}
}

// Feed takes the next piece of output and returns the reasoning and the
// content it releases (either may lag: text that could start a tag is held
// until the next piece tells).
func (p *Parser) Feed(s string) (reasoning, content string) {
	var r, c strings.Builder
	p.buf += s
	for p.buf != "" {
		switch p.st {
		case start:
			t := strings.TrimLeft(p.buf, " \t\r\n")
			switch {
			case strings.HasPrefix(t, Open):
				p.st, p.buf = inside, t[len(Open):]
			case strings.HasPrefix(Open, t): // white space, or a prefix of <think>
				return r.String(), c.String()
			default:
				p.st = answering
			}
		case inside:
			if i := strings.Index(p.buf, Close); i >= 0 {
				r.WriteString(p.buf[:i])
				p.st, p.buf = after, p.buf[i+len(Close):]
				continue
			}
			k := prefixHeld(p.buf, Close)
			r.WriteString(p.buf[:len(p.buf)-k])
			p.buf = p.buf[len(p.buf)-k:]
			return r.String(), c.String()
		case after:
			p.buf = strings.TrimLeft(p.buf, " \t\r\n")
			if p.buf != "" {
				p.st = answering
			}
		case answering:
			c.WriteString(p.buf)
			p.buf = ""
		}
	}
	return r.String(), c.String()
}

// Flush ends the output and returns what was held.
func (p *Parser) Flush() (reasoning, content string) {
	b := p.buf
	p.buf = ""
	switch p.st {
	case inside:
		return b, ""
	case after:
		return "", ""
	}
	return "", b // start: white space or a cut "<thi"; answering: nothing held
}

// prefixHeld is the length of the longest suffix of s that is a proper
// prefix of tag.
func prefixHeld(s, tag string) int {
	for n := min(len(tag)-1, len(s)); n > 0; n-- {
		if strings.HasSuffix(s, tag[:n]) {
			return n
		}
	}
	return 0
}
