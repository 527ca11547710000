# Input functions of the BiasIG rules (biasig.smk): the VQA shards of each generator (from
# the plug-in's jobs) and the settings of the prompt table.

from stereolens.biasig.settings import BiasIGSettings

BG = config["biasig"]
BIASIG_SETTINGS = BiasIGSettings.keys()
BG_OUT = layout("biasig")


@per_job
def get_biasig_vqa_outputs(wildcards):
    """The VQA shards of one generator (the wildcards' model): the plug-in's VQA jobs of it."""
    return job_outputs("biasig", "vqa", "model").get((wildcards.model,), [])


def get_biasig_settings(wildcards=None):
    """What decides the BiasIG prompt table and shards besides the model (a change reruns
    them): stereolens.biasig.plugin.settings."""
    return generation_settings("biasig", "", "")


def get_biasig_human_labels(wildcards):
    """The human-label table of correct_biasig_reader: biasig.reader_correction
    .human_labels, else (simulate) the simulated one."""
    return BG["reader_correction"]["human_labels"] or BG_OUT.human_labels_simulated


def get_biasig_images_dir(wildcards=None):
    """The folder of BiasIG's generation shards (results/biasig/images), in which
    export_biasig_reader_sample finds each image through its shard's metadata.jsonl (the
    answers it reads were made from every shard)."""
    return BG_OUT.image_shard.split("/{model}/")[0]
