"""VideoAgent: long-video question answering by iterative frame retrieval.

VideoAgent (Wang, Zhang, Zohar, Yeung-Levy, ECCV 2024) answers a question
about a long video by looking at few frames, chosen one round at a time:

1. sample N frames uniformly (the paper: N = 5) and caption them (a VLM);
2. the agent (an LLM) answers from the captions and rates its confidence
   (self-reflection, 1-3);
3. while not confident: it names the segments between the frames seen that
   need more information and writes a query for each; CLIP retrieves the most
   similar frame *inside* each segment; the new frames are captioned and added
   (at most 3 rounds);
4. it answers.  The paper reports 54.1 % on EgoSchema with 8.4 frames a
   question on average.

This recipe is that loop on the package's kernels; the model work is behind
hooks, and every default that stands where a model would is named for what it
is (deterministic, no model):

* **index** (``VideoIndex``): every frame once, in the query space.  The paper
  embeds frames with CLIP.  The default here indexes a frame by the text
  embedding of its EfficientNet-lite0 ImageNet labels (``LabelTextEmbedder``,
  with the package's MiniLM text encoder), a stand-in for a joint image-text
  encoder; any ``(T, E)`` embeddings in the question encoder's space plug in
  (``VideoIndex.from_embeddings``).
* **captioner** (``FrameCaptioner``): a model captioning the frames the agent
  looks at; each looked-at frame counts once in ``frames_used``.  Default: the
  package's ``LabelCaptioner`` (the frame's labels; deterministic, no model).
  Captions are cached per frame across questions, as a deployment would.
* **policy** (``AnswerabilityPolicy``): decides whether the question can be
  answered from what was seen, and which segments to search (with which
  queries).  The paper's LLM self-reflection is the user's hook; the default,
  ``RetrievalConfidencePolicy``, uses retrieval confidence (see there).
* **answerer** (``Answerer``): answers from the captions of the frames seen.
  Default ``CaptionVoteAnswerer``: a deterministic extractive answer (the
  option named by the most relevant captions), not a language model.

The retrieval step is one search of the frame index (a ``CosineIndex`` of
the frame embeddings, normalised once when the index is built;
``keys.search(queries, k, ranges=segments)``, equal to ``cosine_topk`` on the
embeddings) per round: one query row per segment, each
restricted to its segment's frames, so a round costs one kernel launch
whatever the number of segments; after the first round only the segments
split by the frames just added are searched (an unchanged segment keeps its
best frames for the same query).  ``streammem videoagent`` runs it from the
command line (on a video file, or ``--synthetic`` scored against uniform
sampling).

``PlantedEventVideo`` generates a long synthetic video (as ImageNet labels,
deterministic from a seed) with planted answerable events: short spans where
a cue (an animal) appears with the answer (an object), related distractor
events elsewhere (another animal of the same family with a wrong option), and
multiple-choice questions whose ground truth is the answer and the frames
that hold it; ``evaluate`` scores the agent against uniform sampling at the
same frame budget on it.

>>> agent = VideoAgent.from_video("clip.mp4", load_frame_encoder(), load_text_encoder(), fps=2)
>>> result = agent.ask("What vehicle passes the camera?")
>>> result.answer.text, result.frames_used

Out of scope: the paper's LLM prompting (the policy and answerer hooks take
the user's model).
"""
from .agent import (
    AgentResult, AgentState, Answer, Answerer, AnswerabilityPolicy, Assessment, CaptionerAdapter, CaptionVoteAnswerer,
    FrameCaptioner, RetrievalConfidencePolicy, RoundLog, VideoAgent,
)
from .evaluation import STRATEGIES, evaluate
from .index import LabelTextEmbedder, VideoIndex, uniform_indices, unobserved_segments
from .synthetic import PlantedEventVideo, PlantedQuestion

__all__ = [
    "VideoIndex",
    "LabelTextEmbedder",
    "FrameCaptioner",
    "CaptionerAdapter",
    "AgentState",
    "Assessment",
    "AnswerabilityPolicy",
    "RetrievalConfidencePolicy",
    "Answer",
    "Answerer",
    "CaptionVoteAnswerer",
    "RoundLog",
    "AgentResult",
    "VideoAgent",
    "uniform_indices",
    "unobserved_segments",
    "PlantedQuestion",
    "PlantedEventVideo",
    "evaluate",
    "STRATEGIES",
]
