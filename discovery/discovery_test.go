package discovery

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/stage-kv/stage/internal/dnstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func server(t *testing.T) *dnstest.Server {
	t.Helper()
	s, err := dnstest.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestLookup(t *testing.T) {
	s := server(t)
	s.Set("decode.stage.test", "10.0.0.2", "10.0.0.1", "fd00::7")
	r := Resolver(s.Addr())
	for _, tt := range []struct {
		name    string
		set     []string
		arg     string
		want    []string
		wantErr bool
	}{
		{"three records", nil, "decode.stage.test:7100", []string{"10.0.0.1:7100", "10.0.0.2:7100", "[fd00::7]:7100"}, false},
		{"one record", []string{"10.0.0.9"}, "decode.stage.test:7100", []string{"10.0.0.9:7100"}, false},
		{"no such name", nil, "nothing.stage.test:7100", nil, false},
		{"no port", nil, "decode.stage.test", nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.set != nil {
				s.Set("decode.stage.test", tt.set...)
			}
			got, err := Lookup(context.Background(), r, tt.arg)
			if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, %v; want %v (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestLookupServerFails(t *testing.T) {
	s := server(t)
	s.Set("decode.stage.test", "10.0.0.1")
	s.Fail(true)
	_, err := Lookup(context.Background(), Resolver(s.Addr()), "decode.stage.test:7100")
	if err == nil {
		t.Fatal("SERVFAIL: got no error, want one (a failed lookup must not empty the peers)")
	}
}

// TestWatch: records that appear and vanish reach update, each lookup
// asking the server again.
func TestWatch(t *testing.T) {
	s := server(t)
	s.Set("decode.stage.test", "10.0.0.1")
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		Watch(ctx, Resolver(s.Addr()), "decode.stage.test:7100", 20*time.Millisecond, func(a []string, err error) {
			mu.Lock()
			defer mu.Unlock()
			if s := fmt.Sprint(a, err); len(seen) == 0 || seen[len(seen)-1] != s {
				seen = append(seen, s)
			}
		})
	}()
	wait := func(want string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			last := ""
			if len(seen) > 0 {
				last = seen[len(seen)-1]
			}
			mu.Unlock()
			if last == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("last answer %q, want %q", last, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	wait("[10.0.0.1:7100] <nil>")
	s.Set("decode.stage.test", "10.0.0.1", "10.0.0.2")
	wait("[10.0.0.1:7100 10.0.0.2:7100] <nil>")
	s.Set("decode.stage.test")
	wait("[] <nil>")
	cancel()
	<-done
	if q := s.Queries(); q < 3 {
		t.Fatalf("%d queries, want at least 3", q)
	}
}
