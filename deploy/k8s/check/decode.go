// Package check decodes stage's Kubernetes manifests (deploy/k8s) strictly
// into their typed API objects; its tests check the invariants the
// manifests must keep. It is its own module so that k8s.io stays out of
// stage's main module.
package check

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// kinds are the objects the manifests may hold. Anything else is an error:
// a new kind must be added here, with invariants in the tests.
var kinds = map[schema.GroupVersionKind]func() any{
	{Version: "v1", Kind: "ConfigMap"}:                  func() any { return &corev1.ConfigMap{} },
	{Version: "v1", Kind: "Secret"}:                     func() any { return &corev1.Secret{} },
	{Version: "v1", Kind: "Service"}:                    func() any { return &corev1.Service{} },
	{Group: "apps", Version: "v1", Kind: "Deployment"}:  func() any { return &appsv1.Deployment{} },
	{Group: "apps", Version: "v1", Kind: "StatefulSet"}: func() any { return &appsv1.StatefulSet{} },
}

// Object is one decoded document of a manifest file.
type Object struct {
	File  string // base name
	Index int    // document number in the file, from 0
	GVK   schema.GroupVersionKind
	Name  string
	Obj   any // *corev1.ConfigMap, *appsv1.Deployment, ...
}

func (o Object) String() string {
	return fmt.Sprintf("%s#%d %s/%s", o.File, o.Index, o.GVK.Kind, o.Name)
}

// Documents splits a multi-document YAML stream, dropping documents that
// hold nothing (only comments or separators).
func Documents(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		j, err := yaml.YAMLToJSON(d)
		if err != nil {
			return nil, err
		}
		if s := strings.TrimSpace(string(j)); s == "null" || s == "" {
			continue
		}
		docs = append(docs, d)
	}
}

// Decode decodes one document into the typed object of its apiVersion and
// kind, rejecting unknown kinds, unknown or duplicate fields and values of
// the wrong type.
func Decode(doc []byte) (schema.GroupVersionKind, any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return schema.GroupVersionKind{}, nil, err
	}
	gv, err := schema.ParseGroupVersion(tm.APIVersion)
	if err != nil {
		return schema.GroupVersionKind{}, nil, fmt.Errorf("apiVersion %q: %w", tm.APIVersion, err)
	}
	gvk := gv.WithKind(tm.Kind)
	mk, ok := kinds[gvk]
	if !ok {
		return gvk, nil, fmt.Errorf("unknown kind %q of apiVersion %q", tm.Kind, tm.APIVersion)
	}
	obj := mk()
	if err := strict(doc, obj); err != nil {
		return gvk, nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return gvk, obj, nil
}

// strict decodes YAML into obj the way the API server reads a request:
// duplicate keys are errors, and JSON keys must match field names exactly
// (encoding/json, which sigs.k8s.io/yaml.UnmarshalStrict uses, would take
// "targetport" for targetPort); unknown fields are errors.
func strict(doc []byte, obj any) error {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	serrs, err := kjson.UnmarshalStrict(j, obj)
	if err != nil {
		return err
	}
	return errors.Join(serrs...)
}

// LoadFile decodes every document of a manifest file.
func LoadFile(path string) ([]Object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	docs, err := Documents(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var objs []Object
	for i, d := range docs {
		gvk, obj, err := Decode(d)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		name := obj.(metav1.ObjectMetaAccessor).GetObjectMeta().GetName()
		objs = append(objs, Object{File: filepath.Base(path), Index: i, GVK: gvk, Name: name, Obj: obj})
	}
	return objs, nil
}

// ManifestFiles lists the manifests of dir: every .yaml file but the
// kustomization.
func ManifestFiles(dir string) ([]string, error) {
	ms, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if filepath.Base(m) != "kustomization.yaml" {
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Kustomization is the part of kustomization.yaml these manifests use;
// decoding it strictly rejects any other field.
type Kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// LoadKustomization decodes dir/kustomization.yaml strictly.
func LoadKustomization(dir string) (*Kustomization, error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k Kustomization
	if err := strict(data, &k); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("kustomization.yaml: apiVersion %q kind %q, want kustomize.config.k8s.io/v1beta1 Kustomization", k.APIVersion, k.Kind)
	}
	return &k, nil
}
