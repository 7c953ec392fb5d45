package config

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"strings"
)

// Size units. KiB, MiB, GiB and TiB are binary; KB, MB, GB and TB decimal.
const (
	KiB ByteSize = 1 << 10
	MiB ByteSize = 1 << 20
	GiB ByteSize = 1 << 30
	TiB ByteSize = 1 << 40
)

// sizeUnits maps a lower-case unit to its factor.
var sizeUnits = map[string]uint64{
	"":    1,
	"b":   1,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
	"kb":  1e3,
	"mb":  1e6,
	"gb":  1e9,
	"tb":  1e12,
}

// ParseByteSize reads a size: a non-negative number with an optional unit,
// "4MiB", "512KiB", "1GiB", "64KB" (64000), "100B", "1048576". Units are
// case-insensitive and may be separated from the number by spaces. A
// fraction is accepted only when the result is a whole number of bytes
// ("1.5KiB" is 1536, "1.5B" is an error).
func ParseByteSize(s string) (ByteSize, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("empty size")
	}
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	if num == "" {
		if strings.HasPrefix(t, "-") {
			return 0, fmt.Errorf("size %q is negative", s)
		}
		return 0, fmt.Errorf("size %q does not start with a number", s)
	}
	if strings.Count(num, ".") > 1 || num[0] == '.' || num[len(num)-1] == '.' {
		return 0, fmt.Errorf("size %q: malformed number %q", s, num)
	}
	factor, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)", s, t[i:])
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		if n != 0 && n > math.MaxUint64/factor {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return ByteSize(n * factor), nil
	}
	r, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("size %q: malformed number %q", s, num)
	}
	r.Mul(r, new(big.Rat).SetInt(new(big.Int).SetUint64(factor)))
	if !r.IsInt() {
		return 0, fmt.Errorf("size %q is not a whole number of bytes", s)
	}
	n := r.Num()
	if !n.IsUint64() {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return ByteSize(n.Uint64()), nil
}

// String writes the size with the largest unit that divides it exactly,
// binary units first: "4MiB", "1536KiB", "64KB", "1000B", "0B". The result
// parses back to the same size.
func (s ByteSize) String() string {
	if s == 0 {
		return "0B"
	}
	for _, u := range []struct {
		name   string
		factor uint64
	}{
		{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
	} {
		if uint64(s)%u.factor == 0 {
			return strconv.FormatUint(uint64(s)/u.factor, 10) + u.name
		}
	}
	return strconv.FormatUint(uint64(s), 10) + "B"
}

// UnmarshalText reads a size written as ParseByteSize accepts it.
func (s *ByteSize) UnmarshalText(text []byte) error {
	v, err := ParseByteSize(string(text))
	if err != nil {
		return err
	}
	*s = v
	return nil
}
