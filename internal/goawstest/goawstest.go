// Package goawstest runs goaws (github.com/Admiral-Piett/goaws), a local
// SQS and SNS, inside a test process, for the tests of sink/sqssink and
// sink/snssink.
//
// goaws speaks the AWS query protocol (form requests, XML answers) and
// knows neither SendMessageBatch with message attributes nor PublishBatch.
// The AWS SDK for Go v2 sends SQS requests in the AWS JSON protocol, and
// the sinks send batches. Server therefore sits in front of goaws's own
// router and translates, without storing anything itself: an SQS JSON
// request becomes the query request goaws serves, and its XML answer
// becomes JSON; SendMessageBatch and PublishBatch become one SendMessage or
// Publish per entry, in entry order, and their answers become the batch's
// per-entry results. Every entry of those two batch calls is recorded
// (Sent), so that tests can check the FIFO fields a request carried.
//
// What goaws itself does with the messages (storage, receive order,
// FIFO de-duplication by MessageDeduplicationId, SNS to SQS delivery with
// raw message delivery) is goaws's. goaws keeps its state in package
// variables, so there is one Server per process (Start).
package goawstest

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/Admiral-Piett/goaws/app"
	"github.com/Admiral-Piett/goaws/app/router"
	"github.com/sirupsen/logrus"
)

// Region and Account are those of every queue URL and ARN goaws makes.
const (
	Region  = "us-east-1"
	Account = "100010001000"
)

// MaxMessageSize is the message body size goaws refuses above.
const MaxMessageSize = 256 << 10

// Sent is one entry of a SendMessageBatch or PublishBatch request.
type Sent struct {
	Action  string // "SendMessageBatch" or "PublishBatch"
	Dest    string // queue URL or topic ARN
	Body    string
	GroupID string // MessageGroupId
	DedupID string // MessageDeduplicationId
}

// Server is goaws behind the translation, listening on loopback.
type Server struct {
	// Addr is host:port of the listener.
	Addr  string
	inner http.Handler

	mu   sync.Mutex
	sent []Sent
}

var (
	once    sync.Once
	started *Server
	failure error
)

// Start starts the process's Server once and returns it; later calls
// return the same one. It is never stopped: goaws's state lives as long
// as the process.
func Start() (*Server, error) {
	once.Do(func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			failure = fmt.Errorf("goawstest: listen: %w", err)
			return
		}
		host, port, _ := net.SplitHostPort(ln.Addr().String())
		logrus.SetOutput(io.Discard)
		app.CurrentEnvironment = app.Environment{
			Host: host, Port: port, Region: "", AccountID: Account,
			EnableDuplicates: true,
			QueueAttributeDefaults: app.EnvQueueAttributes{
				VisibilityTimeout: 30, MaximumMessageSize: MaxMessageSize,
			},
		}
		s := &Server{Addr: ln.Addr().String(), inner: router.New()}
		go http.Serve(ln, s)
		started = s
	})
	return started, failure
}

// URL is the endpoint to give the SDK clients.
func (s *Server) URL() string { return "http://" + s.Addr }

// QueueARN is the ARN of the queue named name, for SNS subscriptions.
func QueueARN(name string) string { return "arn:aws:sqs:" + Region + ":" + Account + ":" + name }

// Sent returns the batch entries sent to dest so far, in order.
func (s *Server) Sent(dest string) []Sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Sent
	for _, e := range s.sent {
		if e.Dest == dest {
			out = append(out, e)
		}
	}
	return out
}

func (s *Server) record(e Sent) {
	s.mu.Lock()
	s.sent = append(s.sent, e)
	s.mu.Unlock()
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if target := r.Header.Get("X-Amz-Target"); strings.HasPrefix(target, "AmazonSQS.") {
		s.sqs(w, r, strings.TrimPrefix(target, "AmazonSQS."))
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if r.Form.Get("Action") == "PublishBatch" {
		s.publishBatch(w, r.Form)
		return
	}
	s.inner.ServeHTTP(w, r)
}

// call runs one query request on goaws.
func (s *Server) call(action string, form url.Values) *httptest.ResponseRecorder {
	form.Set("Action", action)
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	s.inner.ServeHTTP(rec, req)
	return rec
}

// queryError is goaws's XML error answer.
func queryError(rec *httptest.ResponseRecorder) app.ErrorResult {
	var e app.ErrorResponse
	if err := xml.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Result.Code == "" {
		return app.ErrorResult{Code: "InternalError", Message: rec.Body.String()}
	}
	return e.Result
}

// jsonCodes maps goaws's query error codes to the SQS JSON protocol's.
var jsonCodes = map[string]string{
	"AWS.SimpleQueueService.NonExistentQueue": "QueueDoesNotExist",
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, e app.ErrorResult) {
	code := e.Code
	if c, ok := jsonCodes[code]; ok {
		code = c
	}
	writeJSON(w, status, map[string]string{"__type": "com.amazonaws.sqs#" + code, "message": e.Message})
}

type attrValue struct {
	DataType    string `json:"DataType"`
	StringValue string `json:"StringValue,omitempty"`
}

type sqsRequest struct {
	QueueName           string
	QueueUrl            string
	Attributes          map[string]string
	ReceiptHandle       string
	MaxNumberOfMessages int
	VisibilityTimeout   *int
	Entries             []struct {
		Id                     string
		MessageBody            string
		MessageAttributes      map[string]attrValue
		MessageGroupId         string
		MessageDeduplicationId string
	}
}

// sqs serves one SQS JSON request.
func (s *Server) sqs(w http.ResponseWriter, r *http.Request, action string) {
	var in sqsRequest
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
		writeJSONError(w, http.StatusBadRequest, app.ErrorResult{Code: "InvalidParameterValue", Message: err.Error()})
		return
	}
	form := url.Values{}
	if in.QueueUrl != "" {
		form.Set("QueueUrl", in.QueueUrl)
	}
	switch action {
	case "CreateQueue", "GetQueueUrl":
		form.Set("QueueName", in.QueueName)
		n := 1
		for k, v := range in.Attributes {
			form.Set(fmt.Sprintf("Attribute.%d.Name", n), k)
			form.Set(fmt.Sprintf("Attribute.%d.Value", n), v)
			n++
		}
		rec := s.call(action, form)
		if rec.Code != http.StatusOK {
			writeJSONError(w, rec.Code, queryError(rec))
			return
		}
		var queueURL string
		if action == "CreateQueue" {
			var out app.CreateQueueResponse
			xml.Unmarshal(rec.Body.Bytes(), &out)
			queueURL = out.Result.QueueUrl
		} else {
			var out app.GetQueueUrlResponse
			xml.Unmarshal(rec.Body.Bytes(), &out)
			queueURL = out.Result.QueueUrl
		}
		writeJSON(w, http.StatusOK, map[string]string{"QueueUrl": queueURL})
	case "DeleteQueue", "DeleteMessage", "PurgeQueue":
		if in.ReceiptHandle != "" {
			form.Set("ReceiptHandle", in.ReceiptHandle)
		}
		rec := s.call(action, form)
		if rec.Code != http.StatusOK {
			writeJSONError(w, rec.Code, queryError(rec))
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{})
	case "ReceiveMessage":
		form.Set("MaxNumberOfMessages", strconv.Itoa(max(in.MaxNumberOfMessages, 1)))
		if in.VisibilityTimeout != nil {
			form.Set("VisibilityTimeout", strconv.Itoa(*in.VisibilityTimeout))
		}
		rec := s.call(action, form)
		if rec.Code != http.StatusOK {
			writeJSONError(w, rec.Code, queryError(rec))
			return
		}
		var out app.ReceiveMessageResponse
		if err := xml.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			writeJSONError(w, http.StatusInternalServerError, app.ErrorResult{Code: "InternalError", Message: err.Error()})
			return
		}
		type message struct {
			MessageId, ReceiptHandle, MD5OfBody, Body string
			MD5OfMessageAttributes                    string               `json:",omitempty"`
			MessageAttributes                         map[string]attrValue `json:",omitempty"`
		}
		msgs := []message{}
		for _, m := range out.Result.Message {
			jm := message{MessageId: m.MessageId, ReceiptHandle: m.ReceiptHandle, MD5OfBody: m.MD5OfBody, Body: string(m.Body), MD5OfMessageAttributes: m.MD5OfMessageAttributes}
			if len(m.MessageAttributes) > 0 {
				jm.MessageAttributes = map[string]attrValue{}
				for _, a := range m.MessageAttributes {
					jm.MessageAttributes[a.Name] = attrValue{DataType: a.Value.DataType, StringValue: a.Value.StringValue}
				}
			}
			msgs = append(msgs, jm)
		}
		writeJSON(w, http.StatusOK, map[string]any{"Messages": msgs})
	case "SendMessageBatch":
		type ok struct {
			Id, MessageId, MD5OfMessageBody string
			MD5OfMessageAttributes          string `json:",omitempty"`
			SequenceNumber                  string `json:",omitempty"`
		}
		type failed struct {
			Id, Code, Message string
			SenderFault       bool
		}
		succeeded, fails := []ok{}, []failed{}
		for i, e := range in.Entries {
			f := url.Values{"QueueUrl": {in.QueueUrl}, "MessageBody": {e.MessageBody}}
			if e.MessageGroupId != "" {
				f.Set("MessageGroupId", e.MessageGroupId)
			}
			if e.MessageDeduplicationId != "" {
				f.Set("MessageDeduplicationId", e.MessageDeduplicationId)
			}
			n := 1
			for k, v := range e.MessageAttributes {
				f.Set(fmt.Sprintf("MessageAttribute.%d.Name", n), k)
				f.Set(fmt.Sprintf("MessageAttribute.%d.Value.DataType", n), v.DataType)
				f.Set(fmt.Sprintf("MessageAttribute.%d.Value.StringValue", n), v.StringValue)
				n++
			}
			rec := s.call("SendMessage", f)
			if rec.Code != http.StatusOK {
				qe := queryError(rec)
				if i == 0 && qe.Code == "AWS.SimpleQueueService.NonExistentQueue" {
					writeJSONError(w, rec.Code, qe)
					return
				}
				fails = append(fails, failed{Id: e.Id, Code: qe.Code, Message: qe.Message, SenderFault: rec.Code < 500})
				continue
			}
			s.record(Sent{Action: action, Dest: in.QueueUrl, Body: e.MessageBody, GroupID: e.MessageGroupId, DedupID: e.MessageDeduplicationId})
			var out app.SendMessageResponse
			xml.Unmarshal(rec.Body.Bytes(), &out)
			succeeded = append(succeeded, ok{Id: e.Id, MessageId: out.Result.MessageId, MD5OfMessageBody: out.Result.MD5OfMessageBody,
				MD5OfMessageAttributes: out.Result.MD5OfMessageAttributes, SequenceNumber: out.Result.SequenceNumber})
		}
		writeJSON(w, http.StatusOK, map[string]any{"Successful": succeeded, "Failed": fails})
	default:
		writeJSONError(w, http.StatusBadRequest, app.ErrorResult{Code: "UnsupportedOperation", Message: "goawstest: " + action + " is not translated"})
	}
}

// publishBatch serves an SNS PublishBatch request (query protocol) as one
// Publish per entry.
func (s *Server) publishBatch(w http.ResponseWriter, form url.Values) {
	topic := form.Get("TopicArn")
	var ok, failed bytes.Buffer
	for i := 1; ; i++ {
		p := fmt.Sprintf("PublishBatchRequestEntries.member.%d.", i)
		id := form.Get(p + "Id")
		if id == "" {
			break
		}
		f := url.Values{"TopicArn": {topic}, "Message": {form.Get(p + "Message")}}
		for n := 1; ; n++ {
			a := fmt.Sprintf("%sMessageAttributes.entry.%d.", p, n)
			name := form.Get(a + "Name")
			if name == "" {
				break
			}
			b := fmt.Sprintf("MessageAttributes.entry.%d.", n)
			f.Set(b+"Name", name)
			f.Set(b+"Value.DataType", form.Get(a+"Value.DataType"))
			f.Set(b+"Value.StringValue", form.Get(a+"Value.StringValue"))
		}
		rec := s.call("Publish", f)
		if rec.Code != http.StatusOK {
			qe := queryError(rec)
			if i == 1 && (rec.Code == http.StatusNotFound || strings.Contains(qe.Code, "NotFound") || strings.Contains(qe.Code, "NonExistent")) {
				w.WriteHeader(rec.Code)
				w.Write(rec.Body.Bytes())
				return
			}
			fmt.Fprintf(&failed, "<member><Id>%s</Id><Code>%s</Code><Message>%s</Message><SenderFault>%t</SenderFault></member>",
				esc(id), esc(qe.Code), esc(qe.Message), rec.Code < 500)
			continue
		}
		s.record(Sent{Action: "PublishBatch", Dest: topic, Body: form.Get(p + "Message"),
			GroupID: form.Get(p + "MessageGroupId"), DedupID: form.Get(p + "MessageDeduplicationId")})
		var out app.PublishResponse
		xml.Unmarshal(rec.Body.Bytes(), &out)
		fmt.Fprintf(&ok, "<member><Id>%s</Id><MessageId>%s</MessageId></member>", esc(id), esc(out.Result.MessageId))
	}
	w.Header().Set("Content-Type", "text/xml")
	fmt.Fprintf(w, `<PublishBatchResponse xmlns="http://sns.amazonaws.com/doc/2010-03-31/"><PublishBatchResult><Successful>%s</Successful><Failed>%s</Failed></PublishBatchResult><ResponseMetadata><RequestId>00000000-0000-0000-0000-000000000000</RequestId></ResponseMetadata></PublishBatchResponse>`,
		ok.String(), failed.String())
}

func esc(s string) string {
	var b bytes.Buffer
	xml.EscapeText(&b, []byte(s))
	return b.String()
}
