"""Answer generation: turn a question and its retrieved hits into a cited `Answer`.

Only the offline extractive answerer (`generate.extractive`) exists so far; language-model
providers come later.
"""
