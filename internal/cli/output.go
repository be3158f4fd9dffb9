package cli

import (
	"encoding/json"
	"io"

	"sigs.k8s.io/yaml"
)

// printStructured writes v to out as indented JSON or as YAML, the -o json
// and -o yaml of every command, with the JSON field names in both.
func printStructured(out io.Writer, format string, v any) error {
	if format == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	data, err := yaml.Marshal(v)
	if err != nil {
		return err
	}
	_, err = out.Write(data)
	return err
}
