"""thdcp inside other libraries' stacks. Each integration is a module imported on its own, so
that `import thdcp` never imports (or needs) the library it integrates with:

    import thdcp.integrations.transformers      # attn_implementation="thdcp" for Hugging Face models
"""
