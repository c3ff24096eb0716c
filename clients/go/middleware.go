package idem

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"
)

// MiddlewareOptions configure Idem.Middleware. A zero field takes the
// Idem's setting (Wait, Lease, MaxTries, Durable, Owner) or the
// middleware's default.
type MiddlewareOptions struct {
	// Scope names the service: the record is http:<Scope>:<Idempotency-Key>
	// under the Idem's prefix, or http:<Idempotency-Key> without a Scope.
	Scope string
	// Wait is how long a repeat waits for the first one at work before it
	// answers 409: default the Idem's Wait (10 s unless set), Off for none.
	Wait time.Duration
	// Lease of a request's claim: default the Idem's Lease (whole seconds).
	Lease time.Duration
	// MaxTries failures of the handler under one key, then 500: default the
	// Idem's MaxTries, or 3 when the Idem has none.
	MaxTries int
	// Durable: default the Idem's.
	Durable *Durable
	// Owner sent with each request's claim: default the Idem's.
	Owner string
	// Methods the middleware applies to: default POST and PATCH.
	Methods []string
	// Required answers 400 to a request of those methods without the header.
	Required bool
}

// Middleware is the Idempotency-Key middleware of an Idem: the Idem's
// settings, unless its own options set them, with counters of its own.
type Middleware struct {
	idem    *Idem
	opts    MiddlewareOptions
	methods []string
}

// Middleware makes the Idempotency-Key middleware; see Middleware.Handler.
// Its error is an invalid option (a Lease that is not whole seconds).
func (i *Idem) Middleware(opts MiddlewareOptions) (*Middleware, error) {
	o := i.opts
	o.Codec = BytesCodec{}
	if opts.Wait != 0 {
		o.Wait = opts.Wait
	}
	if opts.Lease != 0 {
		o.Lease = opts.Lease
	}
	if opts.MaxTries != 0 {
		o.MaxTries = opts.MaxTries
	} else if o.MaxTries == 0 {
		o.MaxTries = 3
	}
	if opts.Durable != nil {
		o.Durable = opts.Durable
	}
	if opts.Owner != "" {
		o.Owner = opts.Owner
	}
	if o.Edition == EditionAuto {
		o.Edition = i.core.edition()
	}
	mi, err := New(i.client, o)
	if err != nil {
		return nil, err
	}
	m := &Middleware{idem: mi, opts: opts, methods: opts.Methods}
	if m.methods == nil {
		m.methods = []string{http.MethodPost, http.MethodPatch}
	}
	return m, nil
}

// Stats are the middleware's counters.
func (m *Middleware) Stats() Stats { return m.idem.Stats() }

// Handler makes an http.Handler idempotent under the Idempotency-Key
// header (its value without leading and trailing spaces and tabs): the
// first request with a key runs the handler and its response is stored
// when the handler finishes, whether or not the client is still connected
// (the handler's context is not cancelled when it leaves). A repeat gets
// the stored response with Idempotent-Replayed: true; a repeat while the
// first is at work waits, then 409 with Retry-After: 1; another method,
// target or body under the key is 422. A handler that answers 5xx (or
// panics) stores nothing and the claim is released; MaxTries such failures
// answer 500.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	opts := m.opts
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idemKey := strings.Trim(r.Header.Get("Idempotency-Key"), " \t")
		if !slices.Contains(m.methods, r.Method) || (idemKey == "" && !opts.Required) {
			next.ServeHTTP(w, r)
			return
		}
		if idemKey == "" {
			http.Error(w, "this request needs an Idempotency-Key header", http.StatusBadRequest)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "the request body could not be read", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		target := r.RequestURI
		if target == "" { // a request made in-process, not read from a client
			target = r.URL.RequestURI()
		}
		fingerprint := Fingerprint(r.Method, target, body)
		run := func(ctx context.Context, job *Job) ([]byte, error) {
			rec := &recorder{header: http.Header{}}
			next.ServeHTTP(rec, r.WithContext(ctx))
			stored, err := rec.stored()
			if err == nil && rec.status() >= 500 {
				err = &handlerFailed{response: stored}
			}
			return stored, err
		}
		// The client leaving does not stop the handler nor its DONE.
		res, err := Process(context.WithoutCancel(r.Context()), m.idem, httpKey(opts.Scope, idemKey), run,
			WithPayload([]byte(fingerprint)))
		writeOutcome(w, res, err)
	})
}

// httpKey is the record's key of a request: the same in every library.
func httpKey(scope, idemKey string) string {
	if scope == "" {
		return "http:" + idemKey
	}
	return "http:" + scope + ":" + idemKey
}

// Fingerprint is the middleware's PAYLOAD: the lowercase hex SHA-256 of
// "METHOD SP target LF body", the target as received (the path, then "?"
// and the raw query when there is one).
func Fingerprint(method, target string, body []byte) string {
	h := sha256.New()
	io.WriteString(h, strings.ToUpper(method)+" "+target+"\n")
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

func writeOutcome(w http.ResponseWriter, res Outcome[[]byte], err error) {
	var failed *handlerFailed
	var notStored *ResultNotStoredError
	var lost *LeaseLostError
	var hook *HookError
	var unconfirmed *DoneUnconfirmedError
	var notDurable *NotDurableError
	switch {
	case errors.As(err, &failed):
		writeStored(w, failed.response, false)
	case errors.Is(err, ErrBusy):
		w.Header().Set("Retry-After", "1")
		http.Error(w, "a request with this Idempotency-Key is in progress", http.StatusConflict)
	case errors.Is(err, ErrMismatch):
		http.Error(w, "Idempotency-Key reused with another request", http.StatusUnprocessableEntity)
	case errors.Is(err, ErrExhausted):
		http.Error(w, "this request failed too often: send it again with a new Idempotency-Key", http.StatusInternalServerError)
	case errors.As(err, &notStored):
		writeStored(w, notStored.Result.([]byte), false)
	case errors.As(err, &notDurable) && notDurable.Stage == StageDone && res.Replayed && res.Value != nil:
		// A repeat whose read the replicas did not acknowledge: the
		// stored response, as any replay (none kept: 503, send again).
		writeStored(w, res.Value, true)
	case errors.As(err, &lost), errors.As(err, &hook) && hook.Result != nil, errors.As(err, &unconfirmed),
		errors.As(err, &notDurable) && notDurable.Stage == StageDone && !res.Replayed:
		// The handler ran: its own response, though another is the one kept.
		writeStored(w, res.Value, false)
	case err != nil:
		http.Error(w, "idempotency store unavailable", http.StatusServiceUnavailable)
	case res.Replayed && res.Value == nil:
		http.Error(w, "this request was completed, but its response was not kept", http.StatusInternalServerError)
	default:
		writeStored(w, res.Value, res.Replayed)
	}
}

// storedResponse is the format every language's middleware stores.
type storedResponse struct {
	V       int         `json:"v"`
	Status  int         `json:"status"`
	Headers [][2]string `json:"headers"`
	Body    []byte      `json:"body"` // base64 in JSON
}

func writeStored(w http.ResponseWriter, data []byte, replayed bool) {
	var s storedResponse
	if err := json.Unmarshal(data, &s); err != nil || s.V != 1 {
		http.Error(w, "the stored response could not be read", http.StatusInternalServerError)
		return
	}
	for _, h := range s.Headers {
		w.Header().Add(h[0], h[1])
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(s.Status)
	w.Write(s.Body)
}

type handlerFailed struct{ response []byte }

func (e *handlerFailed) Error() string { return "idem: the handler answered 5xx" }

// recorder captures the handler's response, so that it is stored whole
// whether or not the client is still there to receive it.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

func (r *recorder) status() int {
	if r.code == 0 {
		return http.StatusOK
	}
	return r.code
}

// hopHeaders are not stored: they describe one connection, not the response.
var hopHeaders = []string{"connection", "keep-alive", "transfer-encoding", "date", "content-length"}

func (r *recorder) stored() ([]byte, error) {
	s := storedResponse{V: 1, Status: r.status(), Headers: [][2]string{}, Body: r.body.Bytes()}
	for name, values := range r.header {
		lower := strings.ToLower(name)
		if slices.Contains(hopHeaders, lower) {
			continue
		}
		for _, v := range values {
			s.Headers = append(s.Headers, [2]string{lower, v})
		}
	}
	sort.Slice(s.Headers, func(a, b int) bool { return s.Headers[a][0] < s.Headers[b][0] })
	return json.Marshal(s)
}
