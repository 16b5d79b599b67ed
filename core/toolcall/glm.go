package toolcall

import (
	"bytes"
	"encoding/json"
	"strings"
)

// The tags of a GLM-4.5 argument.
const (
	keyOpen    = "<arg_key>"
	keyClose   = "</arg_key>"
	valueOpen  = "<arg_value>"
	valueClose = "</arg_value>"
)

type glmState int

const (
	glmText  glmState = iota // content
	glmName                  // after <tool_call>: the name
	glmCall                  // between arguments
	glmKey                   // in <arg_key>
	glmWait                  // between </arg_key> and <arg_value>
	glmValue                 // in <arg_value>
	glmSkip                  // a call past MaxCalls: dropped
)

type glmParser struct {
	base
	st    glmState
	name  string
	index int
	key   string
	nargs int
}

func (p *glmParser) Feed(s string) []Delta {
	p.buf += s
	p.run(false)
	return p.take()
}

func (p *glmParser) Flush() []Delta {
	p.run(true)
	switch p.st {
	case glmName: // cut before its name was whole: not a call
		p.content(Open + p.buf)
	case glmCall, glmKey, glmWait, glmValue:
		p.closeCall()
	}
	p.buf, p.st = "", glmText
	return p.take()
}

// until finds tag in buf: the text before it, and whether it was found
// (buf then starts after it); not found, buf is left as it is.
func (p *glmParser) until(tag string) (string, bool) {
	i := strings.Index(p.buf, tag)
	if i < 0 {
		return "", false
	}
	s := p.buf[:i]
	p.buf = p.buf[i+len(tag):]
	return s, true
}

// skipTo drops leading white space and returns which of tags buf begins
// with (consumed), if one.
func (p *glmParser) skipTo(tags ...string) (string, bool) {
	p.buf = strings.TrimLeft(p.buf, " \t\r\n")
	for _, t := range tags {
		if strings.HasPrefix(p.buf, t) {
			p.buf = p.buf[len(t):]
			return t, true
		}
	}
	return "", false
}

func (p *glmParser) run(final bool) {
	for {
		switch p.st {
		case glmText:
			if p.done {
				p.buf = ""
				return
			}
			if !p.text(final) {
				return
			}
			p.st = glmName
		case glmName:
			i := strings.Index(p.buf, keyOpen)
			j := strings.Index(p.buf, Close)
			if i < 0 && j < 0 {
				if len(p.buf) > maxName {
					p.content(Open)
					p.st = glmText
					continue
				}
				return
			}
			end, next := i, glmKey
			if i < 0 || (j >= 0 && j < i) {
				end, next = j, glmText
			}
			// The name is the first line (text after it, before the first
			// argument, is dropped, as vLLM's parser reads it).
			name, _, _ := strings.Cut(strings.TrimSpace(p.buf[:end]), "\n")
			name = strings.TrimSpace(name)
			if name == "" || end > maxName || strings.ContainsAny(name, "<>") {
				p.content(Open) // not a call: its text is content
				p.st = glmText
				continue
			}
			idx, ok := p.start(name)
			if !ok {
				p.st = glmSkip
				continue
			}
			p.index, p.nargs = idx, 0
			if next == glmKey {
				p.buf = p.buf[end+len(keyOpen):]
			} else {
				p.buf = p.buf[end+len(Close):]
				p.closeCall()
			}
			p.st = next
		case glmCall:
			t, ok := p.skipTo(keyOpen, Close)
			switch {
			case ok && t == keyOpen:
				p.st = glmKey
			case ok:
				p.closeCall()
				p.st = glmText
			default:
				// Stray text between arguments is dropped (as vLLM's
				// parser does), but not what may begin a tag.
				if i := strings.IndexByte(p.buf, '<'); i > 0 {
					p.buf = p.buf[i:]
					continue
				} else if i < 0 {
					p.buf = ""
				} else if !strings.HasPrefix(keyOpen, p.buf) && !strings.HasPrefix(Close, p.buf) {
					p.buf = p.buf[1:]
					continue
				}
				return
			}
		case glmKey:
			k, ok := p.until(keyClose)
			if !ok {
				return
			}
			p.key = strings.TrimSpace(k)
			p.st = glmWait
		case glmWait:
			if _, ok := p.skipTo(valueOpen); ok {
				p.st = glmValue
				continue
			}
			if p.buf != "" && !strings.HasPrefix(valueOpen, p.buf) {
				p.st = glmCall // a key without a value: dropped
				continue
			}
			return
		case glmValue:
			v, ok := p.until(valueClose)
			if !ok {
				return
			}
			p.arg(p.key, v)
			p.st = glmCall
		case glmSkip:
			if _, ok := p.until(Close); !ok {
				p.buf = p.buf[len(p.buf)-heldPrefix(p.buf, Close):]
				return
			}
			p.st = glmText
		}
	}
}

// arg adds one argument to the call's JSON.
func (p *glmParser) arg(key, raw string) {
	var val string
	if p.strs[p.name][key] {
		val = jsonString(raw)
	} else if t := strings.TrimSpace(raw); json.Valid([]byte(t)) {
		var b bytes.Buffer
		_ = json.Compact(&b, []byte(t))
		val = b.String()
	} else {
		val = jsonString(raw)
	}
	sep := ","
	if p.nargs == 0 {
		sep = "{"
	}
	p.nargs++
	p.args(p.index, sep+jsonString(key)+":"+val)
}

func (p *glmParser) closeCall() {
	if p.nargs == 0 {
		p.args(p.index, "{}")
	} else {
		p.args(p.index, "}")
	}
}

// start records the name for the arguments' types.
func (p *glmParser) start(name string) (int, bool) {
	p.name = name
	return p.base.start(name)
}
