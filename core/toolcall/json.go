package toolcall

import (
	"bytes"
	"encoding/json"
	"strings"
)

// jsonParser reads <tool_call>{"name": …, "arguments": {…}}</tool_call>.
// A call is whole only at </tool_call>: its name and arguments come then;
// a body that is not such an object is content, tags included.
type jsonParser struct {
	base
	in bool // after <tool_call>
}

func (p *jsonParser) Feed(s string) []Delta {
	p.buf += s
	p.run(false)
	return p.take()
}

func (p *jsonParser) Flush() []Delta {
	p.run(true)
	if p.in { // cut off: not a call
		p.content(Open + p.buf)
		p.in = false
	}
	p.buf = ""
	return p.take()
}

func (p *jsonParser) run(final bool) {
	for {
		if !p.in {
			if p.done {
				p.buf = ""
				return
			}
			if !p.text(final) {
				return
			}
			p.in = true
		}
		i := strings.Index(p.buf, Close)
		if i < 0 {
			return
		}
		body := p.buf[:i]
		p.buf, p.in = p.buf[i+len(Close):], false
		name, args, ok := parseJSONCall(body)
		if !ok {
			p.content(Open + body + Close)
			continue
		}
		idx, ok := p.start(name)
		if !ok {
			continue // past MaxCalls: run drops the rest
		}
		p.args(idx, args)
	}
}

// parseJSONCall reads {"name": NAME, "arguments": OBJECT} ("parameters"
// is taken for "arguments"; arguments given as a JSON string holding an
// object are that object; none: {}).
func parseJSONCall(body string) (string, string, bool) {
	var c struct {
		Name       *string         `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if err := json.Unmarshal([]byte(body), &c); err != nil || c.Name == nil {
		return "", "", false
	}
	name := strings.TrimSpace(*c.Name)
	if name == "" || len(name) > maxName {
		return "", "", false
	}
	args := c.Arguments
	if len(args) == 0 {
		args = c.Parameters
	}
	if len(args) == 0 || string(args) == "null" {
		return name, "{}", true
	}
	var s string
	if json.Unmarshal(args, &s) == nil {
		args = json.RawMessage(s)
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(args, &obj) != nil || obj == nil {
		return "", "", false
	}
	var b bytes.Buffer
	if json.Compact(&b, args) != nil {
		return "", "", false
	}
	return name, b.String(), true
}
