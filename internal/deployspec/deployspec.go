// Package deployspec reads the deployment files the project ships under
// deploy/ (the Kubernetes manifests, the systemd unit) strictly into their
// API types, and holds the facts of the container image the manifests rely
// on, so that the image builder, the manifests' tests and the CLI's tests
// share one reading of them.
package deployspec

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The container image's fixed parts (deploy/image builds it so; the
// manifests and docs/deploy.md rely on them).
const (
	// ImageBinary is where the outbox command is: the image's entrypoint.
	ImageBinary = "/usr/local/bin/outbox"
	// ImageUID and ImageGID are the non-root user and group the image
	// runs as.
	ImageUID, ImageGID = 65532, 65532
	// ImageUser is that user's name in the image's /etc/passwd.
	ImageUser = "outbox"
	// ImageHome is the user's home and the image's working directory.
	ImageHome = "/home/outbox"
	// ImageCACerts is the image's bundle of CA certificates, the first
	// file Go's crypto/x509 reads on Linux.
	ImageCACerts = "/etc/ssl/certs/ca-certificates.crt"
)

// Paths of the shipped files, relative to the module's root.
const (
	KubernetesDir = "deploy/kubernetes"
	SystemdUnit   = "deploy/systemd/outbox-relay.service"
	AlertRules    = "deploy/prometheus/outbox-alerts.yml"
)

// Kustomization is the part of a kustomization.yaml the manifests use;
// its types are not in k8s.io/api.
type Kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors"`
	} `json:"labels,omitempty"`
	Images []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
	} `json:"images,omitempty"`
}

// Manifests are the objects of a folder of manifests, by kind.
type Manifests struct {
	Kustomization        *Kustomization
	Deployments          []*appsv1.Deployment
	Services             []*corev1.Service
	ServiceAccounts      []*corev1.ServiceAccount
	PodDisruptionBudgets []*policyv1.PodDisruptionBudget
	ServiceMonitors      []*monitoringv1.ServiceMonitor
	PrometheusRules      []*monitoringv1.PrometheusRule
	// Files maps each manifest file (base name) to the kind/name of the
	// objects it holds.
	Files map[string][]string
}

// Load reads every *.yaml file of dir. Each document is decoded strictly:
// a field its type does not have, a kind or apiVersion not listed here, or
// a document without a name is an error naming the file.
func Load(dir string) (*Manifests, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%s: no *.yaml manifest", dir)
	}
	m := &Manifests{Files: map[string][]string{}}
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		base := filepath.Base(p)
		for i, doc := range documents(raw) {
			what, err := m.add(doc)
			if err != nil {
				return nil, fmt.Errorf("%s, document %d: %w", p, i+1, err)
			}
			m.Files[base] = append(m.Files[base], what)
		}
	}
	return m, nil
}

// documents splits a YAML stream at its "---" lines, leaving out empty
// documents (comments only).
func documents(raw []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(raw), -1) {
		empty := true
		for _, line := range strings.Split(d, "\n") {
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				empty = false
				break
			}
		}
		if !empty {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

// add decodes one document strictly into the type its apiVersion and kind
// name, and returns "Kind/name".
func (m *Manifests) add(doc []byte) (string, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", err
	}
	strict := func(v any) error {
		if err := yaml.UnmarshalStrict(doc, v); err != nil {
			return fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
		}
		return nil
	}
	var meta *metav1.ObjectMeta
	switch tm.APIVersion + " " + tm.Kind {
	case "kustomize.config.k8s.io/v1beta1 Kustomization":
		if m.Kustomization != nil {
			return "", errors.New("a second Kustomization")
		}
		m.Kustomization = &Kustomization{}
		return "Kustomization", strict(m.Kustomization)
	case "apps/v1 Deployment":
		o := &appsv1.Deployment{}
		m.Deployments, meta = append(m.Deployments, o), &o.ObjectMeta
		err := strict(o)
		if err != nil {
			return "", err
		}
	case "v1 Service":
		o := &corev1.Service{}
		m.Services, meta = append(m.Services, o), &o.ObjectMeta
		if err := strict(o); err != nil {
			return "", err
		}
	case "v1 ServiceAccount":
		o := &corev1.ServiceAccount{}
		m.ServiceAccounts, meta = append(m.ServiceAccounts, o), &o.ObjectMeta
		if err := strict(o); err != nil {
			return "", err
		}
	case "policy/v1 PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		m.PodDisruptionBudgets, meta = append(m.PodDisruptionBudgets, o), &o.ObjectMeta
		if err := strict(o); err != nil {
			return "", err
		}
	case "monitoring.coreos.com/v1 ServiceMonitor":
		o := &monitoringv1.ServiceMonitor{}
		m.ServiceMonitors, meta = append(m.ServiceMonitors, o), &o.ObjectMeta
		if err := strict(o); err != nil {
			return "", err
		}
	case "monitoring.coreos.com/v1 PrometheusRule":
		o := &monitoringv1.PrometheusRule{}
		m.PrometheusRules, meta = append(m.PrometheusRules, o), &o.ObjectMeta
		if err := strict(o); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("apiVersion %q kind %q: not a kind the shipped manifests use", tm.APIVersion, tm.Kind)
	}
	if meta.Name == "" {
		return "", fmt.Errorf("%s without metadata.name", tm.Kind)
	}
	return tm.Kind + "/" + meta.Name, nil
}

// Deployment returns the Deployment called name.
func (m *Manifests) Deployment(name string) (*appsv1.Deployment, error) {
	i := slices.IndexFunc(m.Deployments, func(d *appsv1.Deployment) bool { return d.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("no Deployment %q", name)
	}
	return m.Deployments[i], nil
}

// Container returns the container called name of d's pod.
func Container(d *appsv1.Deployment, name string) (*corev1.Container, error) {
	cs := d.Spec.Template.Spec.Containers
	i := slices.IndexFunc(cs, func(c corev1.Container) bool { return c.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("Deployment %s has no container %q", d.Name, name)
	}
	return &cs[i], nil
}

// CommandLine is the outbox command a container runs: its command after
// the entrypoint and its args, in the order the image's entrypoint takes
// them. A container that overrides the command with something other than
// the outbox binary is an error.
func CommandLine(c *corev1.Container) ([]string, error) {
	args := slices.Clone(c.Args)
	if len(c.Command) > 0 {
		if c.Command[0] != ImageBinary && c.Command[0] != "outbox" {
			return nil, fmt.Errorf("container %s runs %q, not the outbox command", c.Name, c.Command[0])
		}
		args = append(slices.Clone(c.Command[1:]), args...)
	}
	return args, nil
}

// FlagValue returns the value of --name in args (as --name VALUE or
// --name=VALUE) and whether it is there.
func FlagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// ExecStart reads the systemd unit at path and returns the program and
// arguments of its one ExecStart= line, joined across backslash-newline
// continuations and split as systemd does for unquoted words and
// double-quoted ones (no specifiers or variables are expanded).
func ExecStart(path string) (program string, args []string, _ error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	joined := strings.ReplaceAll(string(raw), "\\\n", " ")
	var lines []string
	for _, l := range strings.Split(joined, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "ExecStart="); ok {
			lines = append(lines, v)
		}
	}
	if len(lines) != 1 {
		return "", nil, fmt.Errorf("%s: %d ExecStart= lines, want 1", path, len(lines))
	}
	words, err := splitWords(strings.TrimLeft(lines[0], "-@:+!"))
	if err != nil {
		return "", nil, fmt.Errorf("%s: ExecStart=: %w", path, err)
	}
	if len(words) == 0 {
		return "", nil, fmt.Errorf("%s: ExecStart= names no program", path)
	}
	return words[0], words[1:], nil
}

// splitWords splits s at blanks, keeping double-quoted words whole.
func splitWords(s string) ([]string, error) {
	var words []string
	var w bytes.Buffer
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, inWord = !quoted, true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, errors.New("unterminated double quote")
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}
