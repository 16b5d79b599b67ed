package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// The byte-level alphabet (GPT-2's bytes_to_unicode): every byte is shown as
// one printable character. Printable Latin-1 bytes stand for themselves; the
// rest (controls, space, 0x7F–0xA0, 0xAD) map to U+0100 onwards in order.
var (
	byteToRune [256]rune
	runeToByte = map[rune]byte{}
)

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// byteLevelDecode turns a token written in the byte-level alphabet back
// into its bytes; a token with a character outside the alphabet (an added
// token such as "<｜User｜>") is its own UTF-8 bytes, as in Hugging Face's
// ByteLevel decoder.
func byteLevelDecode(tok string) []byte {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := runeToByte[r]
		if !ok {
			return []byte(tok)
		}
		out = append(out, b)
	}
	return out
}

// ByteLevelEncode writes bytes in the byte-level alphabet (the spelling of
// vocabulary entries in tokenizer.json).
func ByteLevelEncode(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		sb.WriteRune(byteToRune[c])
	}
	return sb.String()
}

// validPrefix reports how many bytes of b (b[0] a lead byte) form the start
// of a well-formed UTF-8 sequence, and how long that sequence is. It follows
// the table of well-formed byte sequences of the Unicode standard (§3.9,
// table 3-7), so that overlong forms and surrogates are rejected at the
// first byte where they become impossible.
func validPrefix(b []byte) (ok, need int) {
	c := b[0]
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c < 0x80:
		return 1, 1
	case c >= 0xC2 && c <= 0xDF:
		need = 2
	case c == 0xE0:
		need, lo = 3, 0xA0
	case c == 0xED:
		need, hi = 3, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		need = 3
	case c == 0xF0:
		need, lo = 4, 0x90
	case c == 0xF4:
		need, hi = 4, 0x8F
	case c >= 0xF1 && c <= 0xF3:
		need = 4
	default:
		return 0, 1
	}
	ok = 1
	for i := 1; i < need && i < len(b); i++ {
		if b[i] < lo || b[i] > hi {
			return ok, need
		}
		lo, hi = 0x80, 0xBF
		ok++
	}
	return ok, need
}

// appendLossy appends b to sb as text, replacing each maximal ill-formed
// subpart with U+FFFD (the Unicode "substitution of maximal subparts"
// practice, which Rust's from_utf8_lossy and the WHATWG TextDecoder follow).
func appendLossy(sb *strings.Builder, b []byte) {
	for len(b) > 0 {
		if b[0] < utf8.RuneSelf {
			sb.WriteByte(b[0])
			b = b[1:]
			continue
		}
		ok, need := validPrefix(b)
		if ok == need {
			sb.Write(b[:need])
			b = b[need:]
			continue
		}
		sb.WriteRune(utf8.RuneError)
		b = b[max(ok, 1):]
	}
}

// Lossy is b as text, with U+FFFD for each maximal ill-formed subpart.
func Lossy(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	appendLossy(&sb, b)
	return sb.String()
}

// incompleteTail is the length of the suffix of b that is a well-formed
// but unfinished UTF-8 sequence (0 if none): the bytes to hold back until
// the next token completes (or breaks) the character.
func incompleteTail(b []byte) int {
	for k := 1; k <= 3 && k <= len(b); k++ {
		i := len(b) - k
		c := b[i]
		if c < 0x80 {
			return 0
		}
		if c >= 0xC0 { // a lead byte (or an invalid one)
			ok, need := validPrefix(b[i:])
			if ok == k && k < need {
				return k
			}
			return 0
		}
	}
	return 0
}
