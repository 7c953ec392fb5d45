package config

import (
	"strings"
	"testing"
)

func TestParseByteSize(t *testing.T) {
	good := []struct {
		in   string
		want ByteSize
	}{
		{"0", 0},
		{"1048576", 1 << 20},
		{"100B", 100},
		{"100b", 100},
		{"4MiB", 4 << 20},
		{"4mib", 4 << 20},
		{"4MIB", 4 << 20},
		{"512KiB", 512 << 10},
		{"1GiB", 1 << 30},
		{"2TiB", 2 << 40},
		{"64KB", 64000},
		{"64kb", 64000},
		{"1MB", 1000000},
		{"3GB", 3000000000},
		{"1TB", 1000000000000},
		{"1.5KiB", 1536},
		{"0.5MiB", 512 << 10},
		{"1.5KB", 1500},
		{" 4 MiB ", 4 << 20},
		{"18446744073709551615", 1<<64 - 1},
	}
	for _, tt := range good {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseByteSize(tt.in)
			if err != nil || got != tt.want {
				t.Errorf("got %d, %v, want %d, nil", got, err, tt.want)
			}
		})
	}
	bad := []struct{ in, wantErr string }{
		{"", "empty"},
		{"  ", "empty"},
		{"-1", "negative"},
		{"-4MiB", "negative"},
		{"+4MiB", "number"},
		{"MiB", "number"},
		{"4QB", "unit"},
		{"4 M", "unit"},
		{"4k", "unit"},
		{"1e3", "unit"},
		{"1.5B", "whole"},
		{"0.3KiB", "whole"},
		{"1..5KiB", "malformed"},
		{".5KiB", "malformed"},
		{"5.KiB", "malformed"},
		{"18446744073709551616", "too large"},
		{"16777216TiB", "too large"},
		{"99999999999999999999.5GiB", "too large"},
	}
	for _, tt := range bad {
		t.Run("bad "+tt.in, func(t *testing.T) {
			got, err := ParseByteSize(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("got %d, %v, want an error saying %q", got, err, tt.wantErr)
			}
		})
	}
}

func TestByteSizeString(t *testing.T) {
	tests := []struct {
		in   ByteSize
		want string
	}{
		{0, "0B"},
		{1, "1B"},
		{1000, "1KB"},
		{1023, "1023B"},
		{1024, "1KiB"},
		{1536, "1536B"},
		{4 * MiB, "4MiB"},
		{1536 * KiB, "1536KiB"},
		{64000, "64KB"},
		{GiB, "1GiB"},
		{64 * GiB, "64GiB"},
		{3 * TiB, "3TiB"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.in.String(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			back, err := ParseByteSize(tt.in.String())
			if err != nil || back != tt.in {
				t.Errorf("round trip: got %d, %v, want %d", back, err, tt.in)
			}
		})
	}
}

func TestByteSizeFromYAML(t *testing.T) {
	tests := []struct {
		name, value string
		want        ByteSize
		wantErr     bool
	}{
		{"int", "1048576", MiB, false},
		{"string", `"2MiB"`, 2 * MiB, false},
		{"bare unit", "8MiB", 8 * MiB, false},
		{"decimal", "128KB", 128000, false},
		{"whole float", "1048576.0", MiB, false},
		{"fraction float", "1048576.5", 0, true},
		{"negative int", "-1048576", 0, true},
		{"bool", "true", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("STAGE_SECURITY_TOKEN", "x")
			c, err := Load(writeFile(t, "staging:\n  slot_size: "+tt.value+"\n"), nil)
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), "staging.slot_size") {
					t.Fatalf("got %v, want an error naming staging.slot_size", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Staging.SlotSize != tt.want {
				t.Errorf("got %s, want %s", c.Staging.SlotSize, tt.want)
			}
		})
	}
}
