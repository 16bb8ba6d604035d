package deploy_test

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/outboxkit/outbox/internal/deployspec"
)

var update = flag.Bool("update", false, "regenerate kubernetes/prometheusrule.yaml from prometheus/outbox-alerts.yml")

// manifests reads deploy/kubernetes strictly.
func manifests(t *testing.T) *deployspec.Manifests {
	t.Helper()
	m, err := deployspec.Load("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// Every manifest decodes strictly into its API type, kustomization.yaml
// lists every other manifest file and nothing else, and the objects the
// docs describe are there.
func TestManifestsDecodeStrictly(t *testing.T) {
	m := manifests(t)
	if m.Kustomization == nil {
		t.Fatal("kubernetes/ has no kustomization.yaml")
	}
	var files []string
	for f := range m.Files {
		if f != "kustomization.yaml" {
			files = append(files, f)
		}
	}
	slices.Sort(files)
	if got := slices.Sorted(slices.Values(m.Kustomization.Resources)); !slices.Equal(got, files) {
		t.Errorf("kustomization.yaml lists %v, the folder holds %v", got, files)
	}
	var objects []string
	for _, objs := range m.Files {
		objects = append(objects, objs...)
	}
	for _, want := range []string{"Deployment/outbox-relay", "Deployment/outbox-console", "PodDisruptionBudget/outbox-relay",
		"Service/outbox-relay", "Service/outbox-console", "ServiceMonitor/outbox-relay", "PrometheusRule/outbox-alerts", "ServiceAccount/outbox"} {
		if !slices.Contains(objects, want) {
			t.Errorf("the manifests lack %s; they hold %v", want, objects)
		}
	}
}

// A manifest with a field its type lacks is refused: the decoding is
// strict.
func TestLoadRefusesUnknownFields(t *testing.T) {
	dir := t.TempDir()
	raw, err := os.ReadFile("kubernetes/relay.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(raw, []byte("          readinessProbe:\n"), []byte("          readynessProbe:\n"), 1)
	if bytes.Equal(bad, raw) {
		t.Fatal("relay.yaml has no readinessProbe to misspell")
	}
	if err := os.WriteFile(dir+"/relay.yaml", bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := deployspec.Load(dir); err == nil || !strings.Contains(err.Error(), "readynessProbe") {
		t.Fatalf("Load of a Deployment with readynessProbe: %v, want an error naming the field", err)
	}
}

// hardened fails unless the pod runs as the image's non-root user with a
// read-only root filesystem, no privilege escalation, no capabilities and
// bounded memory.
func hardened(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	ps := d.Spec.Template.Spec
	if sc := ps.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser != deployspec.ImageUID ||
		sc.RunAsGroup == nil || *sc.RunAsGroup != deployspec.ImageGID || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: the pod's securityContext must run as non-root %d:%d with the RuntimeDefault seccomp profile: %+v", d.Name, deployspec.ImageUID, deployspec.ImageGID, ps.SecurityContext)
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("%s mounts a service account token it does not use", d.Name)
	}
	for _, c := range ps.Containers {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("%s/%s: the container must have a read-only root filesystem, no privilege escalation, run as non-root and drop ALL capabilities: %+v", d.Name, c.Name, sc)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s/%s: want CPU and memory requests and a memory limit: %+v", d.Name, c.Name, c.Resources)
		}
		if c.Image != "outbox" {
			t.Errorf("%s/%s: image %q, want outbox (kustomization's images: sets the registry and tag)", d.Name, c.Name, c.Image)
		}
		if c.LivenessProbe == nil || c.ReadinessProbe == nil {
			t.Errorf("%s/%s: want a liveness and a readiness probe", d.Name, c.Name)
		}
	}
}

// containerPort resolves a probe's or a Service's target port (a name or
// a number) to a port c declares.
func containerPort(t *testing.T, c *corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %s declares no port %s", c.Name, p.String())
	return 0
}

// addrPort is the port of a HOST:PORT flag value.
func addrPort(t *testing.T, flag, addr string) int32 {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--%s %q: %v", flag, addr, err)
	}
	var n int32
	if _, err := fmt.Sscan(port, &n); err != nil || n <= 0 {
		t.Fatalf("--%s %q: want a fixed port", flag, addr)
	}
	return n
}

// The relay's probes are /healthz and /readyz on the port --metrics-addr
// serves (cmd/outbox runs the relay with these arguments and calls them:
// TestShippedRelayAnswersItsProbes); its Service, ServiceMonitor and
// PodDisruptionBudget select its pods and port; it is given longer than
// --shutdown-grace to stop; it is hardened.
func TestRelayManifests(t *testing.T) {
	m := manifests(t)
	d, err := m.Deployment("outbox-relay")
	if err != nil {
		t.Fatal(err)
	}
	hardened(t, d)
	c, err := deployspec.Container(d, "relay")
	if err != nil {
		t.Fatal(err)
	}
	args, err := deployspec.CommandLine(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(args) == 0 || args[0] != "relay" {
		t.Fatalf("the relay container runs %q, want outbox relay ...", args)
	}
	addr, ok := deployspec.FlagValue(args, "metrics-addr")
	if !ok {
		t.Fatalf("the relay container runs %q, without --metrics-addr: no metrics and no health endpoints", args)
	}
	if host, _, _ := net.SplitHostPort(addr); host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("--metrics-addr %s: the kubelet and Prometheus reach the pod's IP, not %s", addr, host)
	}
	port := addrPort(t, "metrics-addr", addr)
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Fatalf("the relay's probe %+v is not an HTTP GET", p.probe)
		}
		if p.probe.HTTPGet.Path != p.path {
			t.Errorf("probe path %s, want %s", p.probe.HTTPGet.Path, p.path)
		}
		if got := containerPort(t, c, p.probe.HTTPGet.Port); got != port {
			t.Errorf("probe %s on port %d, --metrics-addr serves %d", p.path, got, port)
		}
		if p.probe.HTTPGet.Scheme != "" && p.probe.HTTPGet.Scheme != corev1.URISchemeHTTP {
			t.Errorf("probe %s: scheme %s, the relay serves HTTP", p.path, p.probe.HTTPGet.Scheme)
		}
	}

	grace, _ := deployspec.FlagValue(args, "shutdown-grace")
	if grace == "" {
		grace = "30s" // the flag's default
	}
	g, err := time.ParseDuration(grace)
	if err != nil {
		t.Fatal(err)
	}
	if tg := d.Spec.Template.Spec.TerminationGracePeriodSeconds; tg == nil || time.Duration(*tg)*time.Second <= g {
		t.Errorf("terminationGracePeriodSeconds %v: want more than --shutdown-grace %s", tg, g)
	}

	pods := labels.Set(d.Spec.Template.Labels)
	sel := labels.SelectorFromSet(d.Spec.Selector.MatchLabels)
	if !sel.Matches(pods) {
		t.Fatalf("the Deployment's selector %s does not match its pods' labels %s", sel, pods)
	}
	var svc *corev1.Service
	for _, s := range m.Services {
		if s.Name == "outbox-relay" {
			svc = s
		}
	}
	if svc == nil || !labels.SelectorFromSet(svc.Spec.Selector).Matches(pods) {
		t.Fatalf("no Service outbox-relay selecting the relay's pods")
	}
	var metricsPort *corev1.ServicePort
	for i, p := range svc.Spec.Ports {
		if containerPort(t, c, p.TargetPort) == port {
			metricsPort = &svc.Spec.Ports[i]
		}
	}
	if metricsPort == nil || metricsPort.Name == "" {
		t.Fatalf("Service outbox-relay has no named port onto --metrics-addr's %d: %+v", port, svc.Spec.Ports)
	}
	if !svc.Spec.PublishNotReadyAddresses {
		t.Error("Service outbox-relay leaves relays that are not ready out, and so their metrics")
	}

	if len(m.ServiceMonitors) != 1 {
		t.Fatalf("%d ServiceMonitors, want 1", len(m.ServiceMonitors))
	}
	sm := m.ServiceMonitors[0]
	if !labels.SelectorFromSet(sm.Spec.Selector.MatchLabels).Matches(labels.Set(svc.Labels)) || len(sm.Spec.Selector.MatchExpressions) > 0 {
		t.Errorf("ServiceMonitor %s does not select Service outbox-relay (labels %v)", sm.Name, svc.Labels)
	}
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != metricsPort.Name || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor %s scrapes %+v, want port %s path /metrics", sm.Name, sm.Spec.Endpoints, metricsPort.Name)
	}

	if len(m.PodDisruptionBudgets) != 1 {
		t.Fatalf("%d PodDisruptionBudgets, want 1", len(m.PodDisruptionBudgets))
	}
	pdb := m.PodDisruptionBudgets[0]
	if s := pdb.Spec.Selector; s == nil || !labels.SelectorFromSet(s.MatchLabels).Matches(pods) {
		t.Errorf("PodDisruptionBudget %s does not select the relay's pods", pdb.Name)
	}
	if d.Spec.Replicas == nil || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 || pdb.Spec.MinAvailable.IntValue() >= int(*d.Spec.Replicas) {
		t.Errorf("PodDisruptionBudget minAvailable %v with %v replicas: want at least 1 and fewer than the replicas, so that a node can be drained", pdb.Spec.MinAvailable, d.Spec.Replicas)
	}
}

// The console serves HTTPS itself from the TLS Secret, reads its users
// from a Secret, and its probes ask the HTTPS port for a public page.
func TestConsoleManifests(t *testing.T) {
	m := manifests(t)
	d, err := m.Deployment("outbox-console")
	if err != nil {
		t.Fatal(err)
	}
	hardened(t, d)
	c, err := deployspec.Container(d, "console")
	if err != nil {
		t.Fatal(err)
	}
	args, err := deployspec.CommandLine(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(args) == 0 || args[0] != "console" {
		t.Fatalf("the console container runs %q, want outbox console ...", args)
	}
	addr, _ := deployspec.FlagValue(args, "addr")
	port := addrPort(t, "addr", addr)
	// Each file flag names a file of a Secret mounted read-only.
	mounted := func(flag string) string {
		t.Helper()
		path, ok := deployspec.FlagValue(args, flag)
		if !ok {
			t.Fatalf("the console runs without --%s: %q", flag, args)
		}
		for _, vm := range c.VolumeMounts {
			if strings.HasPrefix(path, vm.MountPath+"/") {
				if !vm.ReadOnly {
					t.Errorf("--%s: %s is mounted writable", flag, vm.MountPath)
				}
				for _, v := range d.Spec.Template.Spec.Volumes {
					if v.Name == vm.Name && v.Secret != nil {
						return v.Secret.SecretName
					}
				}
			}
		}
		t.Fatalf("--%s %s is in no Secret volume", flag, path)
		return ""
	}
	cert, key := mounted("tls-cert"), mounted("tls-key")
	if cert != key {
		t.Errorf("--tls-cert from Secret %s, --tls-key from %s: want the one TLS Secret", cert, key)
	}
	mounted("users")
	if _, ok := deployspec.FlagValue(args, "dev"); ok {
		t.Error("the console runs with --dev")
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || containerPort(t, c, p.HTTPGet.Port) != port {
			t.Fatalf("the console's probe %+v: want an HTTPS GET on --addr's port %d", p, port)
		}
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
		t.Errorf("the console keeps sign-in sessions in its process: want 1 replica, not %v", d.Spec.Replicas)
	}
}

// Every Secret and key the manifests read is one docs/deploy.md tells how
// to create.
func TestSecretsAreDocumented(t *testing.T) {
	m := manifests(t)
	doc, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{} // Secret -> keys
	for _, d := range m.Deployments {
		ps := d.Spec.Template.Spec
		for _, c := range ps.Containers {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					keys[e.ValueFrom.SecretKeyRef.Name] = append(keys[e.ValueFrom.SecretKeyRef.Name], e.ValueFrom.SecretKeyRef.Key)
				}
			}
		}
		for _, v := range ps.Volumes {
			if v.Secret != nil {
				if _, ok := keys[v.Secret.SecretName]; !ok {
					keys[v.Secret.SecretName] = nil
				}
				for _, it := range v.Secret.Items {
					keys[v.Secret.SecretName] = append(keys[v.Secret.SecretName], it.Key)
				}
			}
		}
	}
	if len(keys) < 3 {
		t.Fatalf("the manifests read %d Secrets, want the relay's, the console's, its TLS and users ones", len(keys))
	}
	for name, ks := range keys {
		i := bytes.Index(doc, []byte("create secret "))
		found := false
		for i >= 0 {
			line := doc[i:]
			for _, end := range []string{"\n\n", "\n```"} {
				if j := bytes.Index(line, []byte(end)); j >= 0 {
					line = line[:j]
				}
			}
			if bytes.Contains(line, []byte(" "+name+" ")) || bytes.HasSuffix(bytes.TrimSpace(line), []byte(" "+name)) {
				found = true
				for _, k := range ks {
					if !bytes.Contains(line, []byte(k+"=")) {
						t.Errorf("docs/deploy.md: the create secret command for %s does not set key %s", name, k)
					}
				}
			}
			next := bytes.Index(doc[i+1:], []byte("create secret "))
			if next < 0 {
				break
			}
			i += 1 + next
		}
		if !found {
			t.Errorf("docs/deploy.md has no kubectl create secret ... %s command", name)
		}
	}
}

// prometheusRuleHeader is what kubernetes/prometheusrule.yaml holds before
// the rules file, whose lines follow indented under spec.
const prometheusRuleHeader = `# Generated from deploy/prometheus/outbox-alerts.yml by
#   go test ./deploy -run TestPrometheusRuleIsTheShippedRules -update
# Edit that file, not this one.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: outbox-alerts
  labels:
    app.kubernetes.io/name: outbox
    app.kubernetes.io/component: relay
spec:
`

// prometheusRule makes kubernetes/prometheusrule.yaml from the rules file.
func prometheusRule(rules []byte) []byte {
	var b bytes.Buffer
	b.WriteString(prometheusRuleHeader)
	for _, line := range strings.SplitAfter(string(rules), "\n") {
		if strings.TrimSpace(line) == "" {
			b.WriteString(line)
			continue
		}
		b.WriteString("  " + line)
	}
	return b.Bytes()
}

// The PrometheusRule is the shipped rules file: the file is made from it
// byte for byte, and decoded strictly, its groups equal the rules file's
// decoded strictly into the operator's types.
func TestPrometheusRuleIsTheShippedRules(t *testing.T) {
	rules, err := os.ReadFile("prometheus/outbox-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	want := prometheusRule(rules)
	const path = "kubernetes/prometheusrule.yaml"
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not made from prometheus/outbox-alerts.yml as it stands: regenerate it with\n\tgo test ./deploy -run TestPrometheusRuleIsTheShippedRules -update", path)
	}

	var file struct {
		Groups []monitoringv1.RuleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(rules, &file); err != nil {
		t.Fatalf("prometheus/outbox-alerts.yml does not decode into the operator's rule groups: %v", err)
	}
	m := manifests(t)
	if len(m.PrometheusRules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(m.PrometheusRules))
	}
	pr := m.PrometheusRules[0]
	if !reflect.DeepEqual(pr.Spec.Groups, file.Groups) {
		t.Fatalf("PrometheusRule %s's groups differ from prometheus/outbox-alerts.yml's", pr.Name)
	}
	var alerts int
	for _, g := range pr.Spec.Groups {
		alerts += len(g.Rules)
	}
	if alerts < 7 {
		t.Fatalf("PrometheusRule %s holds %d rules, want the 7 shipped at least", pr.Name, alerts)
	}
}
