"""Deterministic, Self-Instruct-like instructions for testing and benchmarking the dedup.

Real generated instruction pools are full of paraphrases of each other, so the generator mixes
fresh template fills with edits of earlier instructions (word swaps, drops, insertions,
synonym paraphrases) that land around ROUGE-L 0.7, plus exact and case/punctuation-only
duplicates, empty, punctuation-only and non-ASCII texts: the edge cases of the tokenizer.
"""
from __future__ import annotations

import random

VERBS = ["Write", "Generate", "Create", "Compose", "Draft", "Explain", "Describe", "Summarize",
         "List", "Give", "Suggest", "Classify", "Identify", "Rewrite", "Translate", "Compare",
         "Outline", "Design", "Propose", "Find", "Analyze", "Evaluate", "Convert", "Edit",
         "Brainstorm", "Recommend", "Provide", "Construct", "Plan", "Predict"]
ADJ = ["short", "detailed", "funny", "formal", "persuasive", "simple", "creative", "brief",
       "technical", "friendly", "polite", "concise", "step-by-step", "informal", "catchy",
       "balanced", "critical", "optimistic", "historical", "practical"]
NOUNS = ["poem", "story", "email", "essay", "summary", "list", "tweet", "slogan", "letter",
         "report", "recipe", "review", "dialogue", "speech", "headline", "riddle", "joke",
         "plan", "guide", "proposal", "description", "argument", "question", "answer",
         "title", "product description", "cover letter", "haiku", "limerick", "tutorial"]
TOPICS = ["climate change", "machine learning", "the French Revolution", "healthy eating",
          "remote work", "space exploration", "renewable energy", "a rainy day", "friendship",
          "time management", "the ocean", "electric cars", "public libraries", "coffee",
          "a job interview", "urban gardening", "quantum computing", "the Roman Empire",
          "social media", "sleep hygiene", "volcanoes", "a birthday party", "recycling",
          "the stock market", "learning a language", "honeybees", "chess openings",
          "video games", "minimalism", "the water cycle", "a mountain hike", "cybersecurity",
          "jazz music", "ancient Egypt", "photosynthesis", "budget travel", "dog training",
          "the moon landing", "meditation", "3D printing", "blockchain", "marathon training",
          "the human heart", "poetry slams", "city traffic", "board games", "solar eclipses",
          "artificial intelligence ethics", "kindness", "a lost wallet", "Café culture in Paris",
          "naïve Bayes classifiers", "Zürich's trams", "İstanbul's bazaars", "東京 (Tokyo) food"]
# Topics also come as "<aspect> of <topic>" / "<topic> in <place>": thousands of distinct fills.
ASPECTS = ["the history", "the future", "the economics", "the psychology", "the benefits",
           "the risks", "the science", "the ethics", "common myths", "the basics", "the cost",
           "the environmental impact", "the cultural meaning", "best practices", "the rules"]
PLACES = ["Japan", "rural India", "a small town", "New York", "the Arctic", "Brazil", "Kenya",
          "medieval Europe", "a hospital", "a startup", "high school", "the 1980s", "Mars"]
AUDIENCES = ["for children", "for a ten-year-old", "for experts", "for beginners",
             "for a manager", "for my grandmother", "for high school students", "for a CEO",
             "for tourists", "for software engineers", ""]
CONSTRAINTS = ["in under 50 words", "using exactly three sentences", "in the style of Shakespeare",
               "without using the letter e", "as a bulleted list", "in a positive tone",
               "with a surprising ending", "using simple words", "in JSON format",
               "in 5 steps", "with two examples", "", "", ""]
TEMPLATES = [
    "{verb} a {adj} {noun} about {topic} {aud} {cons}.",
    "{verb} a {noun} about {topic} {cons}.",
    "Can you {verb_l} a {adj} {noun} on {topic}?",
    "Please {verb_l} {topic} {aud}.",
    "{verb} three facts about {topic} {aud}.",
    "I need a {adj} {noun} about {topic}; {verb_l} it {cons}.",
    "What are the pros and cons of {topic}? Answer {cons}.",
    "{verb} the following text about {topic} so that it is more {adj}.",
    "Given a {noun} about {topic}, {verb_l} it {aud}.",
    "{verb} {num} ideas for a {noun} about {topic}.",
    "Tell me why {topic} matters {aud}.",
    "{verb} a {adj} {noun} that explains {topic} {cons}.",
]
SYNONYMS = {"write": "compose", "compose": "write", "create": "generate", "generate": "produce",
            "short": "brief", "brief": "short", "explain": "describe", "describe": "explain",
            "list": "enumerate", "give": "provide", "provide": "give", "about": "on",
            "funny": "humorous", "simple": "easy", "story": "tale", "email": "message",
            "children": "kids", "experts": "specialists", "please": "kindly", "ideas": "suggestions"}
FILLERS = ["please", "quickly", "also", "really", "carefully", "briefly", "now", "again",
           "for me", "in detail", "today", "if possible"]
ODD = ["", "   ", "!!!", "?.,;:-", "…", "— – ·", "🙂🙃", "日本語のテキスト", "ÉÇÀ", "¿¡", "\n\t",
       "Ünïcödé wörds: naïve café résumé", "ﬁle ﬂow", "İİ", "Straße", "100% 🎉 done", "A", "a.",
       "#hashtag @mention", "x" * 3]


def _topic(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.35:
        return f"{rng.choice(ASPECTS)} of {rng.choice(TOPICS)}"
    if r < 0.6:
        return f"{rng.choice(TOPICS)} in {rng.choice(PLACES)}"
    return rng.choice(TOPICS)


def _fill(rng: random.Random) -> str:
    verb = rng.choice(VERBS)
    text = rng.choice(TEMPLATES).format(
        verb=verb, verb_l=verb.lower(), adj=rng.choice(ADJ), noun=rng.choice(NOUNS),
        topic=_topic(rng), aud=rng.choice(AUDIENCES), cons=rng.choice(CONSTRAINTS),
        num=rng.choice(["3", "five", "ten", "7", "a few"]))
    return " ".join(text.split()).replace(" .", ".").replace(" ?", "?")


def _mutate(rng: random.Random, text: str) -> str:
    words = text.split() or [rng.choice(FILLERS)]
    for _ in range(rng.choice([1, 1, 2, 2, 3, 4])):
        op = rng.random()
        if op < 0.3 and len(words) > 2:
            del words[rng.randrange(len(words))]
        elif op < 0.55:
            words.insert(rng.randrange(len(words) + 1), rng.choice(FILLERS))
        elif op < 0.8:
            i = rng.randrange(len(words))
            words[i] = SYNONYMS.get(words[i].lower().strip(".,?;"), rng.choice(ADJ + NOUNS))
        elif len(words) > 1:
            i = rng.randrange(len(words) - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
    return " ".join(words)


def make_instructions(n: int, seed: int = 0) -> list[str]:
    """n instructions, the same for the same (n, seed) on every platform."""
    rng = random.Random(seed)
    out: list[str] = []
    for _ in range(n):
        r = rng.random()
        if out and r < 0.25:
            out.append(_mutate(rng, rng.choice(out[-200:] if rng.random() < 0.7 else out)))
        elif out and r < 0.29:
            src = rng.choice(out)
            out.append(rng.choice([src, src.upper(), src.lower() + "!!", "  " + src + " ..."]))
        elif r < 0.31:
            out.append(rng.choice(ODD))
        else:
            out.append(_fill(rng))
    return out
