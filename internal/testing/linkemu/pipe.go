package linkemu

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

const (
	readSize = 32 << 10
	// smallChunk and below are copied out of the read buffer; larger chunks
	// keep it, so bulk transfers do not copy and small messages do not pin
	// a whole buffer for the length of the delay.
	smallChunk = 4 << 10
	// maxInFlight bounds the bytes a pipe holds back per direction, like a
	// TCP window: throughput through a delay tops out near maxInFlight/delay
	// (about 180 MB/s at 90 ms), and memory stays bounded when the
	// destination stops reading.
	maxInFlight = 16 << 20
	// pacerSlack is how far behind schedule a paced direction may fall and
	// still catch up.
	pacerSlack = 5 * time.Millisecond
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, readSize); return &b }}

// pacer spaces out the bytes of one direction of a Link to its bandwidth.
// It is shared by all of the Link's connections, as one bottleneck would be.
type pacer struct {
	bps  atomic.Int64
	mu   sync.Mutex
	next time.Time // when the bytes reserved so far have gone out
}

// reserve returns when n bytes read at now have gone out. A pacer idle for
// longer than pacerSlack starts at now (no burst credit); within the slack it
// continues from where it was, so that timers firing late do not add up to a
// lower rate.
func (p *pacer) reserve(n int, now time.Time) time.Time {
	bps := p.bps.Load()
	if bps <= 0 {
		return now
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	start := p.next
	if start.Before(now.Add(-pacerSlack)) {
		start = now
	}
	p.next = start.Add(time.Duration(int64(n) * int64(time.Second) / bps))
	return p.next
}

// readLimit keeps a chunk to about 5 ms of the bandwidth, so that a slow
// link releases bytes smoothly rather than in 32 KiB bursts.
func (p *pacer) readLimit() int {
	bps := p.bps.Load()
	if bps <= 0 {
		return readSize
	}
	return int(min(max(bps/200, 512), readSize))
}

type chunk struct {
	data    []byte
	pooled  *[]byte // the buffer to return to bufPool after writing, if any
	release time.Time
}

// pipe carries one direction of a connection. The reader stamps each chunk
// with its release time as it reads it; the writer sends chunks in order when
// they are due. So the delay is fixed per chunk: a destination that reads
// slowly stalls the writer, and the chunks behind are then overdue and go out
// at once instead of each waiting the full delay again.
type pipe struct {
	pc        *proxyConn
	src, dst  net.Conn
	pace      *pacer
	delivered *atomic.Int64

	mu      sync.Mutex
	cond    sync.Cond
	queue   []chunk
	queued  int  // bytes in queue
	eof     bool // src has ended; the writer half-closes dst once drained
	stopped bool // the connection was aborted
}

var errAborted = errors.New("connection aborted")

func newPipe(pc *proxyConn, src, dst net.Conn, pace *pacer, delivered *atomic.Int64) *pipe {
	p := &pipe{pc: pc, src: src, dst: dst, pace: pace, delivered: delivered}
	p.cond.L = &p.mu
	return p
}

// run forwards until src ends and everything read is written, or until
// either side fails, which aborts the whole connection. first is sent ahead
// of anything read (what a held client sent during a partition).
func (p *pipe) run(first []byte) {
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		if err := p.read(first); err != nil {
			p.pc.abort()
		}
	}()
	if err := p.write(); err != nil {
		p.pc.abort()
	}
	<-readerDone
}

func (p *pipe) stop() {
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.cond.Broadcast()
}

func (p *pipe) read(first []byte) error {
	if len(first) > 0 {
		if err := p.enqueue(first, nil); err != nil {
			return err
		}
	}
	scratch := bufPool.Get().(*[]byte)
	defer func() { bufPool.Put(scratch) }()
	for {
		n, err := p.src.Read((*scratch)[:p.pace.readLimit()])
		if n > 0 {
			data, pooled := (*scratch)[:n], scratch
			if n <= smallChunk {
				data, pooled = append([]byte(nil), data...), nil
			} else {
				scratch = bufPool.Get().(*[]byte)
			}
			if err := p.enqueue(data, pooled); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			p.mu.Lock()
			p.eof = true
			p.mu.Unlock()
			p.cond.Broadcast()
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// enqueue stamps data and queues it, waiting while the pipe holds
// maxInFlight bytes, and then while the bandwidth cap has not let it out:
// waiting here (not in the writer) lets the sender feel the cap as TCP
// back-pressure instead of an ever-growing queue.
func (p *pipe) enqueue(data []byte, pooled *[]byte) error {
	now := time.Now()
	departs := p.pace.reserve(len(data), now)
	c := chunk{data: data, pooled: pooled, release: departs.Add(p.pc.delay())}

	p.mu.Lock()
	for p.queued >= maxInFlight && !p.stopped {
		p.cond.Wait()
	}
	if p.stopped {
		p.mu.Unlock()
		return errAborted
	}
	p.queue = append(p.queue, c)
	p.queued += len(data)
	p.mu.Unlock()
	p.cond.Broadcast()

	if wait := departs.Sub(now); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-p.pc.ctx.Done():
			return errAborted
		}
	}
	return nil
}

// next waits for the head chunk. ok is false once src has ended and the
// queue is drained, or the connection was aborted.
func (p *pipe) next() (head chunk, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.queue) == 0 && !p.eof && !p.stopped {
		p.cond.Wait()
	}
	if p.stopped || len(p.queue) == 0 {
		return chunk{}, false
	}
	return p.queue[0], true
}

// takeDue removes every chunk due by now, so that chunks that fell behind
// go out in one write.
func (p *pipe) takeDue(now time.Time, into []chunk) []chunk {
	p.mu.Lock()
	i := 0
	for i < len(p.queue) && !p.queue[i].release.After(now) {
		into = append(into, p.queue[i])
		p.queued -= len(p.queue[i].data)
		p.queue[i] = chunk{}
		i++
	}
	p.queue = p.queue[i:]
	if len(p.queue) == 0 {
		p.queue = nil // let the backing array go; a busy pipe regrows it
	}
	p.mu.Unlock()
	p.cond.Broadcast()
	return into
}

func (p *pipe) write() error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var due []chunk
	var bufs net.Buffers
	for {
		head, ok := p.next()
		if !ok {
			break
		}
		if wait := time.Until(head.release); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-p.pc.ctx.Done():
				return errAborted
			}
		}
		due = p.takeDue(time.Now(), due[:0])
		bufs = bufs[:0]
		for _, c := range due {
			bufs = append(bufs, c.data)
		}
		unsent := bufs // WriteTo consumes the slice it is called on
		n, err := unsent.WriteTo(p.dst)
		p.delivered.Add(n)
		for i, c := range due {
			if c.pooled != nil {
				bufPool.Put(c.pooled)
			}
			due[i] = chunk{}
		}
		if err != nil {
			return err
		}
	}
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	if stopped {
		return errAborted
	}
	// Pass the end of the stream on, so request/response protocols that
	// half-close still see their answer.
	if tc, ok := p.dst.(*net.TCPConn); ok {
		return tc.CloseWrite()
	}
	return nil
}
