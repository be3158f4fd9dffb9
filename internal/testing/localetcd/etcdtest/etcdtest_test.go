package etcdtest_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd"
	"github.com/druid-stretch/druid-stretch/internal/testing/localetcd/etcdtest"
	"github.com/druid-stretch/druid-stretch/internal/testing/testbin"
	"github.com/druid-stretch/druid-stretch/sidecar"
)

// TestStart starts two members behind a WAN with a wrapped sidecar and
// reads the membership both through etcd and through the wrapper.
func TestStart(t *testing.T) {
	testbin.Need(t)
	g := NewWithT(t)
	var wrapped atomic.Int64
	c := etcdtest.Start(t, etcdtest.Options{
		Names:  etcdtest.Numbered("w", 2),
		Sites:  []string{"one", "two"},
		OneWay: 5 * time.Millisecond,
		Wrap: func(_ *localetcd.Member, s *sidecar.Server) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				wrapped.Add(1)
				s.ServeHTTP(w, r)
			})
		},
	})
	g.Expect(c.WAN).NotTo(BeNil())
	g.Expect(c.Members).To(HaveLen(2))
	g.Expect(c.Members[1].Site).To(Equal("two"))

	names := func(via ...*localetcd.Member) []string {
		var out []string
		for _, m := range c.MemberList(g, via...) {
			out = append(out, m.Name)
		}
		return out
	}
	g.Expect(names()).To(ConsistOf("w-0", "w-1"))
	g.Expect(names(c.Members[1])).To(ConsistOf("w-0", "w-1"))

	list, err := sidecar.NewClient(c.Members[0].SidecarURL, c.ClientTLS).Members(t.Context())
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(list.Members).To(HaveLen(2))
	g.Expect(wrapped.Load()).To(BeNumerically(">=", 1), "the call went through Wrap's handler")
}

func TestNumbered(t *testing.T) {
	g := NewWithT(t)
	g.Expect(etcdtest.Numbered("a", 3)).To(Equal([]string{"a-0", "a-1", "a-2"}))
	g.Expect(etcdtest.Numbered("a", 0)).To(BeEmpty())
}
